import { and, desc, eq, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { canonicalLicenseKey, formatLicenseKey, generateLicenseKey } from "../../domain/license-key.ts";
import { defaultExpiry, licenseStatus } from "../../domain/license-state.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError, FieldErrorCollector } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatch, type IfMatch, versionEtag } from "../../http/preconditions.ts";
import { bodyReference } from "../../http/references.ts";
import { checkMetadataKeys } from "../../http/schemas.ts";
import { preparedRowReader } from "../../store/prepared-select.ts";
import { licenses, policies } from "../../store/schema/index.ts";
import { subscriptionGrant } from "../billing/subscriptions.ts";
import type { CustomerService } from "../customers/service.ts";
import { recordAudit } from "../events/service.ts";
import type { PolicyRow, PolicyService } from "../policies/service.ts";
import { settingsOf } from "../policies/service.ts";
import { archived, type ProductService } from "../products/service.ts";
import type { ConvertTrialBody, LicenseCreateBody, LicenseUpdateBody } from "./model.ts";
import { presentLicense } from "./present.ts";
import { checkLicenseQuota } from "./tallies.ts";
import {
  checkEntitlements,
  checkExpiry,
  checkMergedEntitlementSize,
  fieldChanges,
  sentExpiry,
} from "./terms.ts";

export type LicenseRow = typeof licenses.$inferSelect;

export const keyContext = (licenseId: string) => `license-key:${licenseId}`;

export class LicenseService {
  /** Every activation looks its license up by key: prepared once. */
  private readonly byKeyLookup;

  constructor(
    private readonly deps: Deps,
    private readonly products: ProductService,
    private readonly policies: PolicyService,
    private readonly customers: CustomerService,
    private readonly plan: () => PlanDefinition,
  ) {
    // Activation's lookup: compiled once, rows mapped without Drizzle's generic mapper.
    this.byKeyLookup = preparedRowReader<typeof licenses, [string]>(
      deps.sqlite,
      licenses,
      '"key_lookup" = ?',
    );
  }

  list(
    environment: Environment,
    page: PageRequest,
    filter: { productId?: string; customerId?: string },
  ): LicenseRow[] {
    return this.deps.db
      .select()
      .from(licenses)
      .where(
        and(
          eq(licenses.environment, environment),
          filter.productId ? eq(licenses.productId, filter.productId) : undefined,
          filter.customerId ? eq(licenses.customerId, filter.customerId) : undefined,
          page.before ? lt(licenses.id, page.before) : undefined,
        ),
      )
      .orderBy(desc(licenses.id))
      .limit(page.limit + 1)
      .all();
  }

  get(id: string, environment: Environment): LicenseRow {
    const row = this.deps.db.select().from(licenses).where(eq(licenses.id, id)).get();
    if (!row || row.environment !== environment) throw ApiError.notFound("license");
    return row;
  }

  exists(id: string, environment: Environment): boolean {
    const row = this.deps.db
      .select({ environment: licenses.environment })
      .from(licenses)
      .where(eq(licenses.id, id))
      .get();
    return row?.environment === environment;
  }

  /** The license for a key as a device types it (any case, with or without dashes). */
  findByKey(input: string): LicenseRow | undefined {
    const canonical = canonicalLicenseKey(input);
    if (!canonical) return undefined;
    const lookup = this.deps.secrets.lookupHash(canonical, "license-key");
    return this.byKeyLookup(lookup);
  }

  /** The API shape of licenses, with each one's key decrypted and its policy's effective limits. */
  present(rows: LicenseRow[]) {
    const now = this.deps.clock.now();
    const policyById = new Map<string, PolicyRow>();
    for (const row of rows) {
      if (!policyById.has(row.policyId)) {
        const policy = this.deps.db.select().from(policies).where(eq(policies.id, row.policyId)).get();
        if (policy) policyById.set(policy.id, policy);
      }
    }
    return rows.map((row) => {
      const policy = policyById.get(row.policyId);
      if (!policy) throw new Error(`license ${row.id} refers to missing policy ${row.policyId}`);
      const key = formatLicenseKey(this.deps.secrets.decrypt(row.keyCiphertext, keyContext(row.id)));
      return presentLicense(row, settingsOf(policy), key, now);
    });
  }

  presentOne(row: LicenseRow) {
    const [presented] = this.present([row]);
    if (!presented) throw new Error("unreachable: one row in, one out");
    return presented;
  }

  create(body: LicenseCreateBody, ctx: ChangeContext): LicenseRow {
    const now = this.deps.clock.now();
    const plan = this.plan();
    const errors = new FieldErrorCollector();
    const product = bodyReference(
      () => this.products.get(body.product_id, ctx.environment),
      "product_id",
      errors,
    );
    if (product?.status === "archived") throw archived(product.id);
    const policy = bodyReference(
      () => this.policies.get(body.policy_id, ctx.environment),
      "policy_id",
      errors,
    );
    if (policy && product && policy.productId !== product.id)
      errors.add("policy_id", "belongs to another product");
    if (policy?.status === "retired") errors.add("policy_id", "is retired; choose an active policy");
    if (body.customer_id !== undefined && body.customer_id !== null) {
      const customer = bodyReference(
        () => this.customers.get(body.customer_id as string),
        "customer_id",
        errors,
      );
      if (customer?.status === "archived") errors.add("customer_id", "is archived");
    }
    if (policy && body.license_type !== undefined && body.license_type !== policy.licenseType) {
      errors.add("license_type", `must match the policy's license_type (${policy.licenseType})`);
    }
    const expiry = sentExpiry(body, errors);
    checkEntitlements("entitlements", body.entitlements, errors);
    checkMetadataKeys(body.metadata, errors);
    errors.throwIfAny();
    if (!policy || !product) throw new Error("unreachable: references were checked above");
    const settings = settingsOf(policy);
    const expiresAt = expiry === undefined ? defaultExpiry(settings, now) : expiry;
    checkExpiry(expiresAt, now, plan);
    checkLicenseQuota(this.deps.db, plan, settings.license_type, product.environment);

    const key = generateLicenseKey();
    const canonical = canonicalLicenseKey(key) as string;
    const id = this.deps.ids.next("license", now.getTime());
    const row: LicenseRow = {
      id,
      environment: product.environment,
      productId: product.id,
      policyId: policy.id,
      customerId: body.customer_id ?? null,
      keyCiphertext: this.deps.secrets.encrypt(canonical, keyContext(id)),
      keyLookup: this.deps.secrets.lookupHash(canonical, "license-key"),
      licenseType: settings.license_type,
      status: "active",
      statusReason: null,
      expiresAt,
      renewalAuthority: body.renewal_authority ?? settings.renewal_authority,
      maxMachinesOverride: body.max_machines ?? null,
      maxConcurrentOverride: body.max_concurrent ?? null,
      licenseUnitLimitOverride: body.license_unit_limit_override ?? null,
      entitlements: body.entitlements ?? {},
      metadata: body.metadata ?? {},
      version: 1,
      createdAt: now,
      updatedAt: now,
      suspendedAt: null,
      revokedAt: null,
      convertedAt: null,
      expiryAnnounced: null,
    };
    this.deps.db.transaction((tx) => {
      tx.insert(licenses).values(row).run();
      recordAudit(tx, this.deps, ctx, {
        type: "license.created",
        target: { type: "license", id },
        data: { product_id: row.productId, policy_id: row.policyId, license_type: row.licenseType },
      });
    });
    return row;
  }

  update(id: string, body: LicenseUpdateBody, ifMatch: IfMatch | undefined, ctx: ChangeContext): LicenseRow {
    return this.deps.db.transaction((tx) => {
      const now = this.deps.clock.now();
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, versionEtag(current.version));
      const suspendsOnly = Object.keys(body).every(
        (field) => field === "reason" || (field === "status_action" && body.status_action === "suspended"),
      );
      if (!suspendsOnly) this.assertProductActive(current);
      const from = licenseStatus(current, now);
      if (from === "revoked")
        throw transition("revoked", body.status_action ?? "changed", "A revoked license cannot change.");
      const errors = new FieldErrorCollector();
      const expiry = sentExpiry(body, errors);
      checkEntitlements("entitlements", body.entitlements, errors);
      checkMetadataKeys(body.metadata, errors);
      if (body.reason !== undefined && body.status_action === undefined)
        errors.add("reason", "is only accepted with status_action");
      errors.throwIfAny();

      const { changes, fields } = fieldChanges(current, body, expiry);
      if (changes.expiresAt !== undefined) checkExpiry(changes.expiresAt, now, this.plan());
      // Renewal authority handed back to billing: the license takes what its subscription grants
      // now, an end that came while the vendor held it included (no later event would bring it).
      if (changes.renewalAuthority === "external_billing" && expiry === undefined) {
        const granted = subscriptionGrant(tx, id, now, this.plan());
        if (granted !== undefined && granted?.getTime() !== current.expiresAt?.getTime()) {
          changes.expiresAt = granted;
          fields.push("expires_at");
        }
      }

      const events: string[] = [];
      if (body.status_action === "suspended" && current.status !== "suspended") {
        Object.assign(changes, { status: "suspended", suspendedAt: now, statusReason: body.reason ?? null });
        events.push("license.suspended");
      }
      if (body.status_action === "active" && current.status === "suspended") {
        Object.assign(changes, { status: "active", suspendedAt: null, statusReason: body.reason ?? null });
        events.push("license.reinstated");
      }
      // The status it already has, with another reason: `status_reason` is the reason of the last
      // status_action, so it changes as any field does (license.updated); the same reason, or none,
      // changes nothing.
      if (
        events.length === 0 &&
        body.status_action === current.status &&
        body.reason !== undefined &&
        body.reason !== current.statusReason
      ) {
        changes.statusReason = body.reason;
        fields.push("status_reason");
      }
      const next: LicenseRow = { ...current, ...changes };
      if (body.status_action === "active" && licenseStatus(next, now) === "expired") {
        throw transition(
          "expired",
          "active",
          "The license has expired; extend expires_at to a future time in the same request.",
        );
      }
      if (fields.length === 0 && events.length === 0) return current;
      if (from === "expired" && licenseStatus(next, now) === "active") events.push("license.renewed");
      next.version = current.version + 1;
      next.updatedAt = now;
      tx.update(licenses).set(next).where(eq(licenses.id, id)).run();
      if (fields.length > 0) {
        recordAudit(tx, this.deps, ctx, {
          type: "license.updated",
          target: { type: "license", id },
          data: { changes: fields },
        });
      }
      for (const type of events) {
        recordAudit(tx, this.deps, ctx, {
          type,
          target: { type: "license", id },
          data: { reason: body.reason ?? null },
        });
      }
      return next;
    });
  }

  /**
   * Spec §7.3: an archived product takes no changes, so its licenses get no new terms, conversions,
   * packages or users (409 PRODUCT_ARCHIVED). What only takes access away stays allowed: revoking
   * and suspending (docs/api.md "Archived products").
   */
  assertProductActive(license: LicenseRow): void {
    this.products.getActive(license.productId, license.environment);
  }

  /** False for a license of an archived product, which takes no more time from billing either. */
  productIsActive(license: LicenseRow): boolean {
    return this.products.get(license.productId, license.environment).status !== "archived";
  }

  /** Revocation is terminal. Revoking twice is harmless; a stale If-Match still refuses. */
  revoke(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, versionEtag(current.version));
      if (current.status === "revoked") return;
      const now = this.deps.clock.now();
      tx.update(licenses)
        .set({ status: "revoked", revokedAt: now, updatedAt: now, version: current.version + 1 })
        .where(eq(licenses.id, id))
        .run();
      recordAudit(tx, this.deps, ctx, { type: "license.revoked", target: { type: "license", id } });
    });
  }

  /** A trial becomes a full license under another policy of the same product, keeping its key. */
  convertTrial(
    id: string,
    body: ConvertTrialBody,
    ifMatch: IfMatch | undefined,
    ctx: ChangeContext,
  ): LicenseRow {
    return this.deps.db.transaction((tx) => {
      const now = this.deps.clock.now();
      const current = this.get(id, ctx.environment);
      assertIfMatch(ifMatch, versionEtag(current.version));
      this.assertProductActive(current);
      const from = licenseStatus(current, now);
      if (from === "revoked")
        throw transition("revoked", "converted", "A revoked license cannot be converted.");
      if (current.licenseType !== "trial")
        throw transition(current.licenseType, "converted", "Only trial licenses can be converted.");
      const errors = new FieldErrorCollector();
      const target = bodyReference(
        () => this.policies.get(body.target_policy_id, ctx.environment),
        "target_policy_id",
        errors,
      );
      if (target && target.productId !== current.productId)
        errors.add("target_policy_id", "belongs to another product");
      if (target?.status === "retired") errors.add("target_policy_id", "is retired");
      if (target?.licenseType === "trial")
        errors.add("target_policy_id", "is a trial policy; choose a full one");
      const expiry = sentExpiry({ expires_at: body.expires_at }, errors);
      const entitlements = { ...current.entitlements, ...(body.entitlement_overrides ?? {}) };
      checkEntitlements("entitlement_overrides", body.entitlement_overrides, errors);
      // Only when it adds some: a trial stored with more (before the cap) still converts as it is.
      if (body.entitlement_overrides !== undefined)
        checkMergedEntitlementSize("entitlement_overrides", entitlements, errors);
      errors.throwIfAny();
      if (!target) throw new Error("unreachable: target policy was checked above");
      const settings = settingsOf(target);
      const expiresAt = expiry === undefined ? defaultExpiry(settings, now) : expiry;
      checkExpiry(expiresAt, now, this.plan());
      const next: LicenseRow = {
        ...current,
        policyId: target.id,
        licenseType: settings.license_type,
        expiresAt,
        renewalAuthority: settings.renewal_authority,
        entitlements,
        convertedAt: now,
        updatedAt: now,
        version: current.version + 1,
      };
      tx.update(licenses).set(next).where(eq(licenses.id, id)).run();
      recordAudit(tx, this.deps, ctx, {
        type: "license.trial_converted",
        target: { type: "license", id },
        data: { from_policy_id: current.policyId, to_policy_id: target.id },
      });
      return next;
    });
  }
}

const transition = (from: string, to: string, message: string) =>
  new ApiError("INVALID_TRANSITION", message, { from, to });
