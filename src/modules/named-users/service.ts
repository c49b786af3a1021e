import { and, count, desc, eq, inArray, isNull, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import { emailField } from "../../http/email-field.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, opaqueEtag } from "../../http/preconditions.ts";
import { customers, licenseUsers, passkeys, recoveryCodes } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { LicenseAssignments, normalizeEmail } from "./assignments.ts";
import type { LicenseUserCreateBody, LicenseUserUpdateBody } from "./model.ts";
import { endRegistrationLinks } from "./passkeys.ts";

export type LicenseUserRow = typeof licenseUsers.$inferSelect;

export const licenseUserEtag = (row: LicenseUserRow): string => opaqueEtag(row.id, row.revision);

const emailTaken = () =>
  ApiError.validation({ email: ["an active user of this environment already has this address"] });

/**
 * License users (local-ID users identified by email, per environment) and their assignments to
 * named-user licenses. Spec §4.2 rule 6 needs exactly one active user per address, so an active
 * address is unique within its environment (a partial unique index backs the check).
 */
export class NamedUserService {
  /** Users' assignments to licenses (assignments.ts). */
  readonly assignments: LicenseAssignments;

  constructor(private readonly deps: Deps) {
    this.assignments = new LicenseAssignments(deps);
  }

  present(row: LicenseUserRow) {
    return this.presentAll([row])[0] as ReturnType<NamedUserService["presentOne"]>;
  }

  /** A page of users, their recovery codes and passkeys counted in two queries, not two per user. */
  presentAll(rows: LicenseUserRow[]) {
    if (rows.length === 0) return [];
    const ids = rows.map((row) => row.id);
    const remaining = new Map(
      this.deps.db
        .select({ userId: recoveryCodes.userId, n: count() })
        .from(recoveryCodes)
        .where(and(inArray(recoveryCodes.userId, ids), isNull(recoveryCodes.usedAt)))
        .groupBy(recoveryCodes.userId)
        .all()
        .map((c) => [c.userId, c.n]),
    );
    const keys = new Map(
      this.deps.db
        .select({ userId: passkeys.userId, n: count() })
        .from(passkeys)
        .where(inArray(passkeys.userId, ids))
        .groupBy(passkeys.userId)
        .all()
        .map((c) => [c.userId, c.n]),
    );
    return rows.map((row) => this.presentOne(row, remaining.get(row.id) ?? 0, keys.get(row.id) ?? 0));
  }

  private presentOne(row: LicenseUserRow, recoveryCodesLeft: number, passkeyCount: number) {
    return {
      public_id: row.id,
      environment: row.environment,
      email: row.email,
      name: row.name,
      external_ref: row.externalRef,
      customer_id: row.customerId,
      identity: "local" as const,
      status: row.status,
      two_factor: {
        status: row.totpStatus,
        locked: row.twoFactorLockedAt !== null,
        recovery_codes_remaining: row.totpStatus === "none" ? 0 : recoveryCodesLeft,
        passkeys: passkeyCount,
      },
      created_at: row.createdAt.toISOString(),
      updated_at: row.updatedAt.toISOString(),
      disabled_at: row.disabledAt ? row.disabledAt.toISOString() : null,
    };
  }

  list(
    environment: Environment,
    page: PageRequest,
    filter: { email?: string; status?: "active" | "disabled" },
  ) {
    return this.deps.db
      .select()
      .from(licenseUsers)
      .where(
        and(
          eq(licenseUsers.environment, environment),
          filter.email ? eq(licenseUsers.emailNormalized, normalizeEmail(filter.email)) : undefined,
          filter.status ? eq(licenseUsers.status, filter.status) : undefined,
          page.before ? lt(licenseUsers.id, page.before) : undefined,
        ),
      )
      .orderBy(desc(licenseUsers.id))
      .limit(page.limit + 1)
      .all();
  }

  get(id: string, environment: Environment): LicenseUserRow {
    const row = this.deps.db.select().from(licenseUsers).where(eq(licenseUsers.id, id)).get();
    if (!row || row.environment !== environment) throw ApiError.notFound("license user");
    return row;
  }

  create(body: LicenseUserCreateBody, ctx: ChangeContext): LicenseUserRow {
    const now = this.deps.clock.now();
    this.assertCustomer(body.customer_id);
    const email = emailField(body.email);
    const row: LicenseUserRow = {
      id: this.deps.ids.next("user", now.getTime()),
      environment: ctx.environment,
      email: email.address,
      emailNormalized: email.normalized,
      name: body.name ?? null,
      externalRef: body.external_ref ?? null,
      customerId: body.customer_id ?? null,
      status: "active",
      totpStatus: "none",
      totpSecret: null,
      totpLastStep: null,
      secondFactorFailures: 0,
      twoFactorLockedAt: null,
      revision: 1,
      createdAt: now,
      updatedAt: now,
      disabledAt: null,
    };
    this.deps.db.transaction((tx) => {
      if (this.activeWithEmail(ctx.environment, row.emailNormalized)) throw emailTaken();
      tx.insert(licenseUsers).values(row).run();
      recordAudit(tx, this.deps, ctx, {
        type: "license_user.created",
        target: { type: "license_user", id: row.id },
      });
    });
    return row;
  }

  update(
    id: string,
    body: LicenseUserUpdateBody,
    ifMatch: IfMatch | undefined,
    ctx: ChangeContext,
  ): LicenseUserRow {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, licenseUserEtag(current));
      if (body.customer_id !== undefined) this.assertCustomer(body.customer_id, current.customerId);
      const changes: Partial<LicenseUserRow> = {};
      const changed: string[] = [];
      const set = <K extends keyof LicenseUserRow>(
        field: string,
        column: K,
        value: LicenseUserRow[K] | undefined,
      ) => {
        if (value === undefined || value === current[column]) return;
        changes[column] = value;
        changed.push(field);
      };
      const email = body.email === undefined ? undefined : emailField(body.email);
      if (email && email.normalized !== current.emailNormalized) {
        set("email", "email", email.address);
        changes.emailNormalized = email.normalized;
      } else if (email) {
        set("email", "email", email.address);
      }
      set("name", "name", body.name);
      set("external_ref", "externalRef", body.external_ref);
      set("customer_id", "customerId", body.customer_id);
      const now = this.deps.clock.now();
      if (body.status !== undefined && body.status !== current.status) {
        set("status", "status", body.status);
        changes.disabledAt = body.status === "disabled" ? now : null;
      }
      if (changed.length === 0) return current;
      const next: LicenseUserRow = { ...current, ...changes, revision: current.revision + 1, updatedAt: now };
      if (
        next.status === "active" &&
        (changes.emailNormalized !== undefined || changes.status === "active")
      ) {
        const other = this.activeWithEmail(ctx.environment, next.emailNormalized);
        if (other && other !== id) throw emailTaken();
      }
      tx.update(licenseUsers).set(next).where(eq(licenseUsers.id, id)).run();
      // A registration link went to the old address, or to a user the vendor has just shut out.
      if (changes.emailNormalized !== undefined || changes.status === "disabled")
        endRegistrationLinks(tx, id, this.deps.clock.now());
      recordAudit(tx, this.deps, ctx, {
        type:
          next.status === "disabled" && current.status === "active"
            ? "license_user.disabled"
            : "license_user.updated",
        target: { type: "license_user", id },
        data: { changes: changed },
      });
      return next;
    });
  }

  /** Disabling twice is harmless; a stale If-Match still refuses. */
  disable(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    const current = this.get(id, ctx.environment);
    assertIfMatch(ifMatch, licenseUserEtag(current));
    if (current.status === "disabled") return;
    this.update(id, { status: "disabled" }, ifMatch, ctx);
  }

  private activeWithEmail(environment: Environment, emailNormalized: string): string | undefined {
    return this.deps.db
      .select({ id: licenseUsers.id })
      .from(licenseUsers)
      .where(
        and(
          eq(licenseUsers.environment, environment),
          eq(licenseUsers.emailNormalized, emailNormalized),
          eq(licenseUsers.status, "active"),
        ),
      )
      .get()?.id;
  }

  /**
   * docs/api.md: an archived customer cannot change and receives nothing new, so a user is not
   * linked to one (422 keyed customer_id, as a license for one is). Resending the link a user
   * already has links nothing.
   */
  private assertCustomer(customerId: string | null | undefined, linked: string | null = null): void {
    if (!customerId) return;
    const found = this.deps.db
      .select({ status: customers.status })
      .from(customers)
      .where(eq(customers.id, customerId))
      .get();
    if (!found) throw ApiError.validation({ customer_id: ["no customer with that id"] });
    if (found.status === "archived" && customerId !== linked)
      throw ApiError.validation({ customer_id: ["is archived"] });
  }
}
