import { and, desc, eq, lt, sql } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { parseEmailAddress } from "../../domain/email-address.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, opaqueEtag } from "../../http/preconditions.ts";
import { customers, licenses } from "../../store/schema/index.ts";
import { recordSharedAudit } from "../events/service.ts";
import type { CustomerBody } from "./model.ts";

export type CustomerRow = typeof customers.$inferSelect;

/**
 * The address as stored: canonical (domain lower-cased, IDN as punycode) when it parses. The
 * controller refuses anything else (`emailField`), and billing drops a buyer's address that does
 * not parse (billing/buyers.ts); text that still gets here is kept rather than failing a change.
 */
const storedEmail = (email: string): string => parseEmailAddress(email)?.address ?? email;

/**
 * Customers whose address is `email`, case-insensitively: compared as stored (`a@Bücher.example`
 * finds `a@xn--bcher-kva.example`), and as sent, for rows stored as typed before addresses were
 * normalised. Both sides lower-cased by SQLite, so the `customers_email_lower` index serves it.
 */
const emailIs = (email: string) => {
  const forms = [...new Set([storedEmail(email), email])];
  return sql`lower(${customers.email}) in (${sql.join(
    forms.map((form) => sql`lower(${form})`),
    sql`, `,
  )})`;
};

export const customerEtag = (row: CustomerRow): string => opaqueEtag(row.id, row.revision);

export function presentCustomer(row: CustomerRow) {
  return {
    public_id: row.id,
    name: row.name,
    email: row.email,
    external_ref: row.externalRef,
    notes: row.notes,
    status: row.status,
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

const FIELDS = { name: "name", email: "email", external_ref: "externalRef", notes: "notes" } as const;

/** Customers are shared by live and test: every key sees them, but a test key cannot touch live-held ones. */
export class CustomerService {
  constructor(private readonly deps: Deps) {}

  list(page: PageRequest, email?: string): CustomerRow[] {
    return this.deps.db
      .select()
      .from(customers)
      .where(and(email ? emailIs(email) : undefined, page.before ? lt(customers.id, page.before) : undefined))
      .orderBy(desc(customers.id))
      .limit(page.limit + 1)
      .all();
  }

  /** An active customer with this address (see `emailIs`), for the billing integration's buyers. */
  findActiveByEmail(email: string): CustomerRow | undefined {
    return this.deps.db
      .select()
      .from(customers)
      .where(and(emailIs(email), eq(customers.status, "active")))
      .get();
  }

  get(id: string): CustomerRow {
    const row = this.deps.db.select().from(customers).where(eq(customers.id, id)).get();
    if (!row) throw ApiError.notFound("customer");
    return row;
  }

  create(body: CustomerBody, ctx: ChangeContext): CustomerRow {
    if (!body.name && !body.email) {
      throw ApiError.validation({
        name: ["name or email is required"],
        email: ["name or email is required"],
      });
    }
    const now = this.deps.clock.now();
    const row: CustomerRow = {
      id: this.deps.ids.next("customer", now.getTime()),
      name: body.name ?? null,
      email: body.email ? storedEmail(body.email) : null,
      externalRef: body.external_ref ?? null,
      notes: body.notes ?? null,
      status: "active",
      revision: 1,
      createdAt: now,
      updatedAt: now,
      archivedAt: null,
    };
    this.deps.db.transaction((tx) => {
      tx.insert(customers).values(row).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "customer.created",
        target: { type: "customer", id: row.id },
      });
    });
    return row;
  }

  update(id: string, body: CustomerBody, ifMatch: IfMatch | undefined, ctx: ChangeContext): CustomerRow {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id);
      this.assertMayChange(current, ctx);
      assertIfMatch(ifMatch, customerEtag(current));
      if (current.status === "archived") {
        throw new ApiError("INVALID_TRANSITION", "An archived customer cannot change.", { from: "archived" });
      }
      const changes: Partial<CustomerRow> = {};
      for (const [field, column] of Object.entries(FIELDS) as [
        keyof typeof FIELDS,
        (typeof FIELDS)[keyof typeof FIELDS],
      ][]) {
        const given = body[field];
        const value = field === "email" && given ? storedEmail(given) : given;
        if (value !== undefined && value !== current[column]) changes[column] = value;
      }
      const next: CustomerRow = { ...current, ...changes };
      if (!next.name && !next.email) {
        throw ApiError.validation({
          name: ["name or email is required"],
          email: ["name or email is required"],
        });
      }
      if (Object.keys(changes).length === 0) return current;
      next.revision = current.revision + 1;
      next.updatedAt = this.deps.clock.now();
      tx.update(customers).set(next).where(eq(customers.id, id)).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "customer.updated",
        target: { type: "customer", id },
        data: {
          changes: Object.keys(changes).map((c) => Object.entries(FIELDS).find(([, col]) => col === c)?.[0]),
        },
      });
      return next;
    });
  }

  /** Archiving twice is harmless; a stale If-Match still refuses. */
  archive(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const current = this.get(id);
      this.assertMayChange(current, ctx);
      assertIfMatch(ifMatch, customerEtag(current));
      if (current.status === "archived") return;
      const now = this.deps.clock.now();
      tx.update(customers)
        .set({ status: "archived", archivedAt: now, updatedAt: now, revision: current.revision + 1 })
        .where(eq(customers.id, id))
        .run();
      recordSharedAudit(tx, this.deps, ctx, { type: "customer.archived", target: { type: "customer", id } });
    });
  }

  /** Spec 4.3: a test key cannot change or archive a customer that holds a live license. */
  private assertMayChange(customer: CustomerRow, ctx: ChangeContext): void {
    if (ctx.environment !== "test") return;
    const live = this.deps.db
      .select({ id: licenses.id })
      .from(licenses)
      .where(and(eq(licenses.customerId, customer.id), eq(licenses.environment, "live")))
      .limit(1)
      .get();
    if (live) {
      throw new ApiError(
        "ENVIRONMENT_MISMATCH",
        "This customer holds a live license; use a live key to change it.",
        {
          key_environment: "test",
          customer_id: customer.id,
        },
      );
    }
  }
}
