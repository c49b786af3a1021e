import { and, desc, eq, lt } from "drizzle-orm";
import { canonicalize } from "../../crypto/jcs.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import {
  FINGERPRINT_PROFILE_DETAILS,
  type PolicySettings,
  policyDefaults,
  policyViolations,
  revocationExposureSec,
} from "../../domain/policy-rules.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, opaqueEtag } from "../../http/preconditions.ts";
import { licenses, policies } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { archived, type ProductService } from "../products/service.ts";
import type { PolicyCreateBody, PolicyUpdateBody } from "./model.ts";

export type PolicyRow = typeof policies.$inferSelect;

const SETTING_KEYS = [
  "license_type",
  "validation_mode",
  "fail_mode",
  "identity_mode",
  "perpetual_mode",
  "concurrency_unit",
  "fingerprint_profile",
  "renewal_authority",
  "billing_cycle",
  "heartbeat_required",
  "max_machines",
  "max_concurrent",
  "license_unit_limit",
  "cert_ttl_sec",
  "heartbeat_sec",
  "lease_ttl_sec",
  "lease_heartbeat_sec",
  "network_grace_sec",
  "trial_days",
  "entitlements",
] as const satisfies readonly (keyof PolicySettings)[];

export function settingsOf(row: PolicyRow): PolicySettings {
  return {
    license_type: row.licenseType as PolicySettings["license_type"],
    validation_mode: row.validationMode as PolicySettings["validation_mode"],
    fail_mode: row.failMode as PolicySettings["fail_mode"],
    identity_mode: row.identityMode as PolicySettings["identity_mode"],
    perpetual_mode: row.perpetualMode as PolicySettings["perpetual_mode"],
    concurrency_unit: row.concurrencyUnit as PolicySettings["concurrency_unit"],
    fingerprint_profile: row.fingerprintProfile as PolicySettings["fingerprint_profile"],
    renewal_authority: row.renewalAuthority as PolicySettings["renewal_authority"],
    billing_cycle: row.billingCycle as PolicySettings["billing_cycle"],
    heartbeat_required: row.heartbeatRequired,
    max_machines: row.maxMachines,
    max_concurrent: row.maxConcurrent,
    license_unit_limit: row.licenseUnitLimit,
    cert_ttl_sec: row.certTtlSec,
    heartbeat_sec: row.heartbeatSec,
    lease_ttl_sec: row.leaseTtlSec,
    lease_heartbeat_sec: row.leaseHeartbeatSec,
    network_grace_sec: row.networkGraceSec,
    trial_days: row.trialDays,
    entitlements: row.entitlements,
  };
}

function columnsOf(s: PolicySettings) {
  return {
    licenseType: s.license_type,
    validationMode: s.validation_mode,
    failMode: s.fail_mode,
    identityMode: s.identity_mode,
    perpetualMode: s.perpetual_mode,
    concurrencyUnit: s.concurrency_unit,
    fingerprintProfile: s.fingerprint_profile,
    renewalAuthority: s.renewal_authority,
    billingCycle: s.billing_cycle,
    heartbeatRequired: s.heartbeat_required,
    maxMachines: s.max_machines,
    maxConcurrent: s.max_concurrent,
    licenseUnitLimit: s.license_unit_limit,
    certTtlSec: s.cert_ttl_sec,
    heartbeatSec: s.heartbeat_sec,
    leaseTtlSec: s.lease_ttl_sec,
    leaseHeartbeatSec: s.lease_heartbeat_sec,
    networkGraceSec: s.network_grace_sec,
    trialDays: s.trial_days,
    entitlements: s.entitlements,
  };
}

export const policyEtag = (row: PolicyRow): string => opaqueEtag(row.id, row.revision);

export function presentPolicy(row: PolicyRow) {
  const s = settingsOf(row);
  return {
    public_id: row.id,
    product_id: row.productId,
    environment: row.environment,
    name: row.name,
    version: row.policyNumber,
    status: row.status,
    ...s,
    revocation_guarantee_sec: revocationExposureSec(s),
    fingerprint_profile: { ...FINGERPRINT_PROFILE_DETAILS[s.fingerprint_profile] },
    created_at: row.createdAt.toISOString(),
    updated_at: row.updatedAt.toISOString(),
  };
}

/** Only the settings the caller sent, so defaults and current values stay for the rest. */
function sentSettings(body: PolicyCreateBody | PolicyUpdateBody): Partial<PolicySettings> {
  const sent: Partial<Record<keyof PolicySettings, unknown>> = {};
  for (const key of SETTING_KEYS) if (body[key] !== undefined) sent[key] = body[key];
  return sent as Partial<PolicySettings>;
}

export class PolicyService {
  constructor(
    private readonly deps: Deps,
    private readonly products: ProductService,
    private readonly plan: () => PlanDefinition,
  ) {}

  list(environment: Environment, page: PageRequest, productId?: string): PolicyRow[] {
    return this.deps.db
      .select()
      .from(policies)
      .where(
        and(
          eq(policies.environment, environment),
          productId ? eq(policies.productId, productId) : undefined,
          page.before ? lt(policies.id, page.before) : undefined,
        ),
      )
      .orderBy(desc(policies.id))
      .limit(page.limit + 1)
      .all();
  }

  get(id: string, environment: Environment): PolicyRow {
    const row = this.deps.db.select().from(policies).where(eq(policies.id, id)).get();
    if (!row || row.environment !== environment) throw ApiError.notFound("policy");
    return row;
  }

  create(body: PolicyCreateBody, ctx: ChangeContext): PolicyRow {
    const product = this.productFor(body.product_id, ctx.environment);
    const plan = this.plan();
    const settings: PolicySettings = {
      ...policyDefaults(body.license_type ?? "perpetual", plan),
      ...sentSettings(body),
    };
    this.assertValid(settings, plan);
    const now = this.deps.clock.now();
    const row: PolicyRow = {
      id: this.deps.ids.next("policy", now.getTime()),
      productId: product.id,
      environment: product.environment,
      name: body.name,
      policyNumber: 1,
      revision: 1,
      status: "active",
      ...columnsOf(settings),
      createdAt: now,
      updatedAt: now,
      retiredAt: null,
    };
    this.deps.db.transaction((tx) => {
      tx.insert(policies).values(row).run();
      recordAudit(tx, this.deps, ctx, {
        type: "policy.created",
        target: { type: "policy", id: row.id },
        data: { product_id: row.productId, name: row.name, license_type: row.licenseType },
      });
    });
    return row;
  }

  update(id: string, body: PolicyUpdateBody, ifMatch: IfMatch | undefined, ctx: ChangeContext): PolicyRow {
    return this.deps.db.transaction((tx) => {
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, policyEtag(current));
      // Spec §7.3: an archived product's policies are frozen; retiring one (DELETE) is still allowed.
      this.products.getActive(current.productId, current.environment);
      if (current.status === "retired") {
        throw new ApiError("INVALID_TRANSITION", "A retired policy cannot change.", { from: "retired" });
      }
      if (body.product_id !== undefined && body.product_id !== current.productId) {
        throw ApiError.validation({ product_id: ["cannot change; create a policy for the other product"] });
      }
      const before = settingsOf(current);
      const after: PolicySettings = { ...before, ...sentSettings(body) };
      const changed = SETTING_KEYS.filter((key) => canonicalize(before[key]) !== canonicalize(after[key]));
      const renamed = body.name !== undefined && body.name !== current.name;
      if (changed.length === 0 && !renamed) return current;
      if (changed.includes("license_type") && this.hasLicenses(id)) {
        // A license takes its type from its policy at creation; changing it under them would lie.
        throw ApiError.validation({
          license_type: ["cannot change while licenses use this policy; create a new policy instead"],
        });
      }
      this.assertValid(after, this.plan(), { storedEntitlements: body.entitlements === undefined });
      const next: PolicyRow = {
        ...current,
        ...columnsOf(after),
        name: body.name ?? current.name,
        policyNumber: current.policyNumber + 1,
        revision: current.revision + 1,
        updatedAt: this.deps.clock.now(),
      };
      tx.update(policies).set(next).where(eq(policies.id, id)).run();
      recordAudit(tx, this.deps, ctx, {
        type: "policy.updated",
        target: { type: "policy", id },
        data: { changes: renamed ? ["name", ...changed] : changed, version: next.policyNumber },
      });
      return next;
    });
  }

  /**
   * Retired policies keep their licenses working but accept no new ones. Retiring twice is
   * harmless; a stale If-Match still refuses.
   */
  retire(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, policyEtag(current));
      if (current.status === "retired") return;
      const now = this.deps.clock.now();
      tx.update(policies)
        .set({ status: "retired", retiredAt: now, updatedAt: now, revision: current.revision + 1 })
        .where(eq(policies.id, id))
        .run();
      recordAudit(tx, this.deps, ctx, { type: "policy.retired", target: { type: "policy", id } });
    });
  }

  private hasLicenses(policyId: string): boolean {
    return (
      this.deps.db
        .select({ id: licenses.id })
        .from(licenses)
        .where(eq(licenses.policyId, policyId))
        .limit(1)
        .get() !== undefined
    );
  }

  /** A product named in a body: unknown is a field error (422), archived is 409. */
  private productFor(productId: string, environment: Environment) {
    let product: ReturnType<ProductService["get"]>;
    try {
      product = this.products.get(productId, environment);
    } catch (error) {
      if (error instanceof ApiError && error.code === "NOT_FOUND") {
        throw ApiError.validation({ product_id: ["no such product in this environment"] });
      }
      throw error;
    }
    if (product.status === "archived") throw archived(product.id);
    return product;
  }

  private assertValid(
    settings: PolicySettings,
    plan: PlanDefinition,
    options: { storedEntitlements?: boolean } = {},
  ): void {
    const errors = policyViolations(settings, plan, options);
    if (Object.keys(errors).length > 0) throw ApiError.validation(errors);
  }
}
