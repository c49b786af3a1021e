import { desc, eq, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { isId } from "../../domain/ids.ts";
import { ApiError, FieldErrorCollector } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, opaqueEtag } from "../../http/preconditions.ts";
import { webhookEndpoints } from "../../store/schema/index.ts";
import { recordSharedAudit } from "../events/service.ts";
import { isKnownEvent } from "./catalogue.ts";
import { type DestinationKind, parseDestination } from "./destinations.ts";
import { countEndpoints, planHasWebhooks, planOf } from "./enqueue.ts";
import { DEFAULT_OVERLAP_SEC, type WebhookCreateBody, type WebhookUpdateBody } from "./model.ts";
import { newSecret } from "./signing.ts";

export type EndpointRow = typeof webhookEndpoints.$inferSelect;

/** The endpoint's concurrency token (docs/api.md "If-Match and ETag"): changes with every change. */
export const webhookEtag = (row: EndpointRow): string => opaqueEtag(row.id, row.revision);

/** SecretBox contexts: each value is bound to its endpoint and column, so none can be moved elsewhere. */
export const urlContext = (id: string) => `webhook-url:${id}`;
export const secretContext = (id: string) => `webhook-secret:${id}`;
export const previousSecretContext = (id: string) => `webhook-previous-secret:${id}`;

export interface WebhookOptions {
  allowPrivateNetworks: boolean;
}

export const planLacksWebhooks = () =>
  new ApiError("PLAN_ENTITLEMENT_REQUIRED", "The workspace plan does not include webhooks.", {
    entitlement: "webhooks",
  });

const PUBLIC_KIND: Record<DestinationKind, "webhook" | "slack" | "discord" | "teams"> = {
  standard: "webhook",
  slack: "slack",
  discord: "discord",
  teams: "teams",
};

/**
 * Webhook endpoints (spec §4.3): shared by live and test; with live products in the workspace, a
 * test key may read them but not create, change or stop them. A plan without the `webhooks`
 * feature may read, rename, stop and rotate the secret of endpoints (tidying up and security
 * never wait for a plan), but not create one or widen what one receives.
 */
export class WebhookService {
  constructor(
    private readonly deps: Deps,
    private readonly options: WebhookOptions,
  ) {}

  present(row: EndpointRow, now = this.deps.clock.now()) {
    const chat = row.kind !== "standard";
    const overlap = row.previousSecretExpiresAt && row.previousSecretExpiresAt.getTime() > now.getTime();
    return {
      public_id: row.id,
      name: row.name,
      url: chat ? null : this.deps.secrets.decrypt(row.urlCiphertext, urlContext(row.id)),
      url_host: row.urlHost,
      destination: PUBLIC_KIND[row.kind],
      events: row.events,
      status: row.status,
      disabled_reason: row.disabledReason,
      secret_rotation: {
        scheduled: Boolean(overlap),
        activates_at: overlap ? (row.previousSecretExpiresAt as Date).toISOString() : null,
      },
      created_at: row.createdAt.toISOString(),
      updated_at: row.updatedAt.toISOString(),
    };
  }

  list(page: PageRequest): EndpointRow[] {
    return this.deps.db
      .select()
      .from(webhookEndpoints)
      .where(page.before ? lt(webhookEndpoints.id, page.before) : undefined)
      .orderBy(desc(webhookEndpoints.id))
      .limit(page.limit + 1)
      .all();
  }

  get(id: string): EndpointRow {
    // A path segment that cannot be percent-decoded arrives as null despite its type.
    const row = isId("webhook", String(id))
      ? this.deps.db.select().from(webhookEndpoints).where(eq(webhookEndpoints.id, id)).get()
      : undefined;
    if (!row) throw ApiError.notFound("webhook endpoint");
    return row;
  }

  /** The endpoint and its secret, which is shown here and never again. */
  create(body: WebhookCreateBody, ctx: ChangeContext): { row: EndpointRow; secret: string | null } {
    this.assertEntitled();
    const errors = new FieldErrorCollector();
    const destination = parseDestination(body.url, this.options.allowPrivateNetworks, errors);
    const events = this.checkEvents(body.events ?? ["*"], errors);
    errors.throwIfAny();
    const { url, kind } = destination as NonNullable<typeof destination>;
    const now = this.deps.clock.now();
    const id = this.deps.ids.next("webhook", now.getTime());
    const secret = kind === "standard" ? newSecret() : null;
    const row: EndpointRow = {
      id,
      name: body.name ?? url.hostname,
      kind,
      urlCiphertext: this.deps.secrets.encrypt(url.href, urlContext(id)),
      urlHost: url.hostname,
      events,
      status: "active",
      disabledReason: null,
      secretCiphertext: secret ? this.deps.secrets.encrypt(secret, secretContext(id)) : null,
      previousSecretCiphertext: null,
      previousSecretExpiresAt: null,
      revision: 1,
      createdAt: now,
      updatedAt: now,
    };
    this.deps.db.transaction((tx) => {
      this.assertMayChange(ctx);
      this.assertWithinQuota();
      tx.insert(webhookEndpoints).values(row).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "webhook.created",
        target: { type: "webhook", id },
        data: { url_host: row.urlHost, destination: PUBLIC_KIND[kind], events },
      });
    });
    return { row, secret };
  }

  update(id: string, body: WebhookUpdateBody, ifMatch: IfMatch | undefined, ctx: ChangeContext): EndpointRow {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id);
      this.assertMayChange(ctx);
      assertIfMatch(ifMatch, webhookEtag(current));
      if (current.status === "stopped") {
        throw new ApiError("INVALID_TRANSITION", "A stopped webhook endpoint cannot change.", {
          from: "stopped",
        });
      }
      const errors = new FieldErrorCollector();
      const destination =
        body.url === undefined ? null : parseDestination(body.url, this.options.allowPrivateNetworks, errors);
      const events = body.events === undefined ? undefined : this.checkEvents(body.events, errors);
      if (destination && destination.kind !== current.kind) {
        // A signed endpoint and a chat destination differ in kind: one has a secret, one must not.
        errors.add(
          "url",
          `cannot change a ${PUBLIC_KIND[current.kind]} endpoint into a ${PUBLIC_KIND[destination.kind]} one; create a new endpoint`,
        );
      }
      errors.throwIfAny();
      const changes: Partial<EndpointRow> = {};
      const fields: string[] = [];
      if (body.name !== undefined && body.name !== current.name) {
        changes.name = body.name;
        fields.push("name");
      }
      if (destination) {
        const currentUrl = this.deps.secrets.decrypt(current.urlCiphertext, urlContext(id));
        if (destination.url.href !== currentUrl) {
          changes.urlCiphertext = this.deps.secrets.encrypt(destination.url.href, urlContext(id));
          changes.urlHost = destination.url.hostname;
          fields.push("url");
        }
      }
      if (events && JSON.stringify(events) !== JSON.stringify(current.events)) {
        changes.events = events;
        fields.push("events");
      }
      if (body.status === "active" && current.status === "disabled") {
        Object.assign(changes, { status: "active", disabledReason: null });
        fields.push("status");
      }
      if (fields.length === 0) return current;
      if (fields.some((field) => field !== "name")) this.assertEntitled();
      const next: EndpointRow = {
        ...current,
        ...changes,
        revision: current.revision + 1,
        updatedAt: this.deps.clock.now(),
      };
      tx.update(webhookEndpoints).set(next).where(eq(webhookEndpoints.id, id)).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "webhook.updated",
        target: { type: "webhook", id },
        data: { changes: fields },
      });
      return next;
    });
  }

  /**
   * DELETE: the endpoint stops for good; deliveries not yet made are cancelled. Repeating it
   * changes nothing; a stale If-Match still refuses.
   */
  stop(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const current = this.get(id);
      this.assertMayChange(ctx);
      assertIfMatch(ifMatch, webhookEtag(current));
      if (current.status === "stopped") return;
      const now = this.deps.clock.now();
      tx.update(webhookEndpoints)
        .set({ status: "stopped", updatedAt: now, revision: current.revision + 1 })
        .where(eq(webhookEndpoints.id, id))
        .run();
      cancelPending(this.deps, id, now);
      recordSharedAudit(tx, this.deps, ctx, { type: "webhook.stopped", target: { type: "webhook", id } });
    });
  }

  /**
   * A new secret, returned once. The previous one keeps signing beside it until `overlap_sec` has
   * passed, so receivers can switch without missing a delivery; a rotation during an overlap
   * drops the oldest secret at once.
   */
  rotateSecret(
    id: string,
    overlapSec: number | undefined,
    ifMatch: IfMatch | undefined,
    ctx: ChangeContext,
  ): { row: EndpointRow; secret: string } {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id);
      this.assertMayChange(ctx);
      assertIfMatch(ifMatch, webhookEtag(current));
      if (current.status === "stopped") {
        throw new ApiError("INVALID_TRANSITION", "A stopped webhook endpoint cannot change.", {
          from: "stopped",
        });
      }
      if (current.kind !== "standard" || !current.secretCiphertext) {
        throw new ApiError(
          "INVALID_TRANSITION",
          "Team-chat destinations are not signed and have no secret to rotate.",
          { destination: PUBLIC_KIND[current.kind] },
        );
      }
      const now = this.deps.clock.now();
      const overlap = overlapSec ?? DEFAULT_OVERLAP_SEC;
      const previous = this.deps.secrets.decrypt(current.secretCiphertext, secretContext(id));
      const secret = newSecret();
      const next: EndpointRow = {
        ...current,
        secretCiphertext: this.deps.secrets.encrypt(secret, secretContext(id)),
        previousSecretCiphertext:
          overlap > 0 ? this.deps.secrets.encrypt(previous, previousSecretContext(id)) : null,
        previousSecretExpiresAt: overlap > 0 ? new Date(now.getTime() + overlap * 1000) : null,
        revision: current.revision + 1,
        updatedAt: now,
      };
      tx.update(webhookEndpoints).set(next).where(eq(webhookEndpoints.id, id)).run();
      recordSharedAudit(tx, this.deps, ctx, {
        type: "webhook.secret_rotated",
        target: { type: "webhook", id },
        data: {
          overlap_sec: overlap,
          previous_secret_expires_at: next.previousSecretExpiresAt?.toISOString() ?? null,
        },
      });
      return { row: next, secret };
    });
  }

  private checkEvents(events: readonly string[], errors: FieldErrorCollector): string[] {
    events.forEach((name, i) => {
      if (!isKnownEvent(name))
        errors.add(`events/${i}`, `unknown event "${name}"; see the catalogue in docs/api.md`);
    });
    if (new Set(events).size !== events.length) errors.add("events", "must not repeat a name");
    return [...events];
  }

  /** The plan's `webhook_endpoints`: endpoints not stopped (a disabled one may be re-enabled). */
  private assertWithinQuota(): void {
    const limit = planOf(this.deps.sqlite).quotas.webhook_endpoints?.limit;
    if (limit === undefined) return;
    const used = countEndpoints(this.deps.sqlite);
    if (used >= limit) {
      throw new ApiError("PLAN_QUOTA_EXCEEDED", `The plan allows ${limit} webhook endpoints.`, {
        quota: "webhook_endpoints",
        limit,
        used,
      });
    }
  }

  private assertEntitled(): void {
    if (!planHasWebhooks(this.deps.sqlite)) throw planLacksWebhooks();
  }

  /** Spec §5.1: a test key cannot create, change or stop endpoints once the workspace has live products. */
  private assertMayChange(ctx: ChangeContext): void {
    if (ctx.environment !== "test") return;
    const live = this.deps.sqlite
      .query<{ one: number }, []>("SELECT 1 AS one FROM products WHERE environment = 'live' LIMIT 1")
      .get();
    if (live) {
      throw new ApiError(
        "ENVIRONMENT_MISMATCH",
        "This workspace has live products; use a live key to change webhook endpoints.",
        { key_environment: "test" },
      );
    }
  }
}

/** Deliveries not yet made to an endpoint that stopped or is gone: they will never be made. */
export function cancelPending(deps: Pick<Deps, "sqlite">, endpointId: string, now: Date): void {
  deps.sqlite
    .query<unknown, [number, number, string]>(
      `UPDATE webhook_deliveries SET status = 'cancelled', completed_at = ?, updated_at = ?, claimed_until = NULL
       WHERE endpoint_id = ? AND status IN ('pending', 'delivering')`,
    )
    .run(now.getTime(), now.getTime(), endpointId);
}
