import { desc, eq, lt } from "drizzle-orm";
import { canonicalize } from "../../crypto/jcs.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import { emailField } from "../../http/email-field.ts";
import { ApiError, FieldErrorCollector } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, opaqueEtag } from "../../http/preconditions.ts";
import { checkMetadataKeys } from "../../http/schemas.ts";
import { resellers } from "../../store/schema/index.ts";
import { recordSharedAudit } from "../events/service.ts";
import type { ResellerCreateBody, ResellerUpdateBody } from "./model.ts";

export type ResellerRow = typeof resellers.$inferSelect;

/** The reseller's concurrency token (docs/api.md "If-Match and ETag"): changes with every change. */
export const resellerEtag = (row: ResellerRow): string => opaqueEtag(row.id, row.revision);

/** As customers' addresses: checked in full (the schema's pattern is a first filter) and stored canonical. */
const storedEmail = (email: string | null | undefined): string | null =>
  email ? emailField(email).address : null;

export function presentReseller(row: ResellerRow) {
  return {
    public_id: row.id,
    name: row.name,
    email: row.email,
    external_ref: row.externalRef,
    status: row.status,
    organization_limit: row.organizationLimit,
    user_limit: row.userLimit,
    metadata: row.metadata,
    archived_at: row.archivedAt?.toISOString() ?? null,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

/**
 * The API name of each column a change can set, as `data.changes` of `reseller.updated` lists it
 * (`external_ref`, as the reseller object shows it, never the column's `externalRef`).
 * `archivedAt` follows `status` and is not listed on its own.
 */
const CHANGE_NAMES: Partial<Record<keyof ResellerRow, string>> = {
  name: "name",
  email: "email",
  externalRef: "external_ref",
  organizationLimit: "organization_limit",
  userLimit: "user_limit",
  metadata: "metadata",
  status: "status",
};

function validMetadata(metadata: Record<string, unknown> | undefined): void {
  const errors = new FieldErrorCollector();
  checkMetadataKeys(metadata, errors);
  errors.throwIfAny();
}

/** Reseller records, shared by live and test like customers. */
export class ResellerService {
  constructor(private readonly deps: Deps) {}

  list(page: PageRequest): ResellerRow[] {
    return this.deps.db
      .select()
      .from(resellers)
      .where(page.before ? lt(resellers.id, page.before) : undefined)
      .orderBy(desc(resellers.id))
      .limit(page.limit + 1)
      .all();
  }

  get(id: string): ResellerRow {
    const row = this.deps.db.select().from(resellers).where(eq(resellers.id, id)).get();
    if (!row) throw ApiError.notFound("reseller");
    return row;
  }

  create(body: ResellerCreateBody, ctx: ChangeContext): ResellerRow {
    validMetadata(body.metadata);
    const now = this.deps.clock.now();
    const status = body.status ?? "active";
    const row: ResellerRow = {
      id: this.deps.ids.next("reseller", now.getTime()),
      name: body.name,
      email: storedEmail(body.email),
      externalRef: body.external_ref ?? null,
      status,
      organizationLimit: body.organization_limit ?? null,
      userLimit: body.user_limit ?? null,
      metadata: body.metadata ?? {},
      revision: 1,
      createdAt: now,
      updatedAt: now,
      archivedAt: status === "archived" ? now : null,
    };
    this.deps.db.transaction((tx) => {
      tx.insert(resellers).values(row).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "reseller.created",
        target: { type: "reseller", id: row.id },
      });
    });
    return row;
  }

  update(
    id: string,
    body: ResellerUpdateBody,
    ifMatch: IfMatch | undefined,
    ctx: ChangeContext,
  ): ResellerRow {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id);
      assertIfMatch(ifMatch, resellerEtag(current));
      validMetadata(body.metadata);
      const now = this.deps.clock.now();
      const changes: Partial<ResellerRow> = {};
      if (body.name !== undefined && body.name !== current.name) changes.name = body.name;
      const email = body.email === undefined ? undefined : storedEmail(body.email);
      if (email !== undefined && email !== current.email) changes.email = email;
      if (body.external_ref !== undefined && body.external_ref !== current.externalRef)
        changes.externalRef = body.external_ref;
      if (body.organization_limit !== undefined && body.organization_limit !== current.organizationLimit) {
        changes.organizationLimit = body.organization_limit;
      }
      if (body.user_limit !== undefined && body.user_limit !== current.userLimit)
        changes.userLimit = body.user_limit;
      // Compared in canonical form: the same metadata sent again (keys in another order) is no change.
      if (body.metadata !== undefined && canonicalize(body.metadata) !== canonicalize(current.metadata))
        changes.metadata = body.metadata;
      if (body.status !== undefined && body.status !== current.status) {
        changes.status = body.status;
        changes.archivedAt = body.status === "archived" ? now : null;
      }
      if (Object.keys(changes).length === 0) return current;
      const next: ResellerRow = { ...current, ...changes, revision: current.revision + 1, updatedAt: now };
      tx.update(resellers).set(next).where(eq(resellers.id, id)).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "reseller.updated",
        target: { type: "reseller", id },
        data: { changes: Object.keys(changes).flatMap((c) => CHANGE_NAMES[c as keyof ResellerRow] ?? []) },
      });
      return next;
    });
  }
}
