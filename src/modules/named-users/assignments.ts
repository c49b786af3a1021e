import type { Statement } from "bun:sqlite";
import { and, desc, eq, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { parseEmailAddress } from "../../domain/email-address.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatchWithoutEtag, type IfMatch } from "../../http/preconditions.ts";
import { licenseAssignments, licenses, licenseUsers, policies, products } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { archived } from "../products/service.ts";

export type AssignmentRow = typeof licenseAssignments.$inferSelect;

/** An address's lookup key (src/domain/email-address.ts); text that is no address is only lower-cased, and matches nothing stored. */
export const normalizeEmail = (email: string): string =>
  parseEmailAddress(email)?.normalized ?? email.trim().toLowerCase();

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

/**
 * Named-user licenses' seats: which license users are assigned to which licenses, within each
 * license's `license_unit_limit`, and the lookup of a user by address that sign-in starts from.
 */
export class LicenseAssignments {
  private assignedByEmail?: Statement<unknown[], [string, string, string]>;

  constructor(private readonly deps: Deps) {}

  list(
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
}
