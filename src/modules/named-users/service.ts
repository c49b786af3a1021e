import type { Statement } from "bun:sqlite";
import { and, count, desc, eq, inArray, isNull, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { parseEmailAddress } from "../../domain/email-address.ts";
import type { Environment } from "../../domain/scopes.ts";
import { emailField } from "../../http/email-field.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import {
  assertIfMatch,
  assertIfMatchWithoutEtag,
  type IfMatch,
  opaqueEtag,
} from "../../http/preconditions.ts";
import {
  customers,
  licenseAssignments,
  licenses,
  licenseUsers,
  passkeys,
  policies,
  products,
  recoveryCodes,
} from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { archived } from "../products/service.ts";
import type { LicenseUserCreateBody, LicenseUserUpdateBody } from "./model.ts";
import { endRegistrationLinks } from "./passkeys.ts";

export type LicenseUserRow = typeof licenseUsers.$inferSelect;
export type AssignmentRow = typeof licenseAssignments.$inferSelect;

/** An address's lookup key (src/domain/email-address.ts); text that is no address is only lower-cased, and matches nothing stored. */
export const normalizeEmail = (email: string): string =>
  parseEmailAddress(email)?.normalized ?? email.trim().toLowerCase();
export const licenseUserEtag = (row: LicenseUserRow): string => opaqueEtag(row.id, row.revision);

export function presentAssignment(row: AssignmentRow) {
  return {
    public_id: row.id,
    license_id: row.licenseId,
    user_id: row.userId,
    status: row.status,
    created_at: row.createdAt.toISOString(),
    removed_at: row.removedAt ? row.removedAt.toISOString() : null,
  };
}

const emailTaken = () =>
  ApiError.validation({ email: ["an active user of this environment already has this address"] });

/**
 * License users (local-ID users identified by email, per environment) and their assignments to
 * named-user licenses. Spec §4.2 rule 6 needs exactly one active user per address, so an active
 * address is unique within its environment (a partial unique index backs the check).
 */
export class NamedUserService {
  private assignedByEmail?: Statement<unknown[], [string, string, string]>;

  constructor(private readonly deps: Deps) {}

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

  listAssignments(
    by: { licenseId: string } | { userId: string },
    page: PageRequest,
    status?: "active" | "removed",
  ): AssignmentRow[] {
    return this.deps.db
      .select()
      .from(licenseAssignments)
      .where(
        and(
          "licenseId" in by
            ? eq(licenseAssignments.licenseId, by.licenseId)
            : eq(licenseAssignments.userId, by.userId),
          status ? eq(licenseAssignments.status, status) : undefined,
          page.before ? lt(licenseAssignments.id, page.before) : undefined,
        ),
      )
      .orderBy(desc(licenseAssignments.id))
      .limit(page.limit + 1)
      .all();
  }

  /** Assigns a user to a named-user license, within the license's `license_unit_limit`. */
  assign(licenseId: string, userId: string, ctx: ChangeContext): AssignmentRow {
    return this.deps.db.transaction(
      (tx) => {
        const license = tx.select().from(licenses).where(eq(licenses.id, licenseId)).get();
        if (!license || license.environment !== ctx.environment) throw ApiError.notFound("license");
        // Spec §7.3: an archived product's licenses take no new users (removing one stays allowed).
        const product = tx.select().from(products).where(eq(products.id, license.productId)).get();
        if (product?.status === "archived") throw archived(product.id);
        const user = tx.select().from(licenseUsers).where(eq(licenseUsers.id, userId)).get();
        if (!user || user.environment !== ctx.environment) {
          throw ApiError.validation({ user_id: ["no license user with that id in this environment"] });
        }
        if (user.status !== "active") throw ApiError.validation({ user_id: ["the user is disabled"] });
        const policy = tx.select().from(policies).where(eq(policies.id, license.policyId)).get();
        if (policy?.identityMode !== "named_user") {
          throw new ApiError(
            "INVALID_TRANSITION",
            "Only licenses of a named_user policy take user assignments.",
            {
              identity_mode: policy?.identityMode ?? null,
            },
          );
        }
        if (license.status === "revoked") {
          throw new ApiError("INVALID_TRANSITION", "A revoked license takes no new assignments.", {
            from: "revoked",
          });
        }
        const active = tx
          .select()
          .from(licenseAssignments)
          .where(and(eq(licenseAssignments.licenseId, licenseId), eq(licenseAssignments.status, "active")))
          .all();
        if (active.some((a) => a.userId === userId)) {
          throw ApiError.validation({ user_id: ["the user is already assigned to this license"] });
        }
        const limit = license.licenseUnitLimitOverride ?? policy.licenseUnitLimit;
        if (limit !== null && active.length >= limit) {
          throw new ApiError("INVALID_TRANSITION", "Every named-user seat of this license is assigned.", {
            license_unit_limit: limit,
          });
        }
        const now = this.deps.clock.now();
        const row: AssignmentRow = {
          id: this.deps.ids.next("assignment", now.getTime()),
          environment: ctx.environment,
          licenseId,
          userId,
          status: "active",
          createdAt: now,
          removedAt: null,
        };
        tx.insert(licenseAssignments).values(row).run();
        recordAudit(tx, this.deps, ctx, {
          type: "license_assignment.created",
          target: { type: "license_assignment", id: row.id },
          data: { license_id: licenseId, user_id: userId },
        });
        return row;
      },
      { behavior: "immediate" },
    );
  }

  /** Ends an assignment; the user's devices on the license are refused from their next heartbeat. */
  unassign(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const row = tx.select().from(licenseAssignments).where(eq(licenseAssignments.id, id)).get();
      if (!row || row.environment !== ctx.environment) throw ApiError.notFound("license assignment");
      assertIfMatchWithoutEtag(ifMatch);
      if (row.status === "removed") return;
      tx.update(licenseAssignments)
        .set({ status: "removed", removedAt: this.deps.clock.now() })
        .where(eq(licenseAssignments.id, id))
        .run();
      recordAudit(tx, this.deps, ctx, {
        type: "license_assignment.removed",
        target: { type: "license_assignment", id },
        data: { license_id: row.licenseId, user_id: row.userId },
      });
    });
  }

  /**
   * Rule 6's match in one read that gives back one row of the same shape whatever it finds: how
   * many active users of the environment have this address (exactly one may match), the first
   * one's id and address, and its active assignment to the license. An address with no user costs
   * what one with a user costs: no row object is made for either (a found row took longer to
   * materialise than a missing one, which a verification start's timing would show).
   */
  assignedUserByEmail(
    environment: Environment,
    email: string,
    licenseId: string,
  ): { users: number; userId: string | null; userEmail: string | null; assignmentId: string | null } {
    this.assignedByEmail ??= this.deps.sqlite.prepare<unknown[], [string, string, string]>(
      `SELECT (SELECT count(*) FROM (SELECT 1 FROM license_users WHERE environment = ?1
                 AND email_normalized = ?2 AND status = 'active' LIMIT 2)),
              u.id, u.email, a.id
       FROM (SELECT 1) AS one
       LEFT JOIN license_users AS u ON u.environment = ?1 AND u.email_normalized = ?2 AND u.status = 'active'
       LEFT JOIN license_assignments AS a ON a.license_id = ?3 AND a.user_id = u.id AND a.status = 'active'
       LIMIT 1`,
    );
    const [users, userId, userEmail, assignmentId] = (this.assignedByEmail.values(
      environment,
      normalizeEmail(email),
      licenseId,
    )[0] ?? [0, null, null, null]) as [number, string | null, string | null, string | null];
    return { users, userId, userEmail, assignmentId };
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
