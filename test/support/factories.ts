import { canonicalLicenseKey, generateLicenseKey } from "../../src/domain/license-key.ts";
import { policyDefaults } from "../../src/domain/policy-rules.ts";
import {
  activations,
  customers,
  deviceBlocks,
  licenses,
  policies,
  products,
  resellers,
} from "../../src/store/schema/index.ts";
import type { TestContext } from "./harness.ts";

type ProductInsert = typeof products.$inferInsert;
type PolicyInsert = typeof policies.$inferInsert;
type CustomerInsert = typeof customers.$inferInsert;
type LicenseInsert = typeof licenses.$inferInsert;
type ResellerInsert = typeof resellers.$inferInsert;
type ActivationInsert = typeof activations.$inferInsert;
type DeviceBlockInsert = typeof deviceBlocks.$inferInsert;

/**
 * Rows written straight into the store, typed from the Drizzle schema, for tests that need data to
 * exist without exercising the create routes. Each takes overrides for the fields a test cares about.
 */
export function factories(t: TestContext) {
  const { db, ids, clock, secrets } = t.deps;
  const now = () => clock.now();

  function product(overrides: Partial<ProductInsert> = {}) {
    const id = ids.next("product", now().getTime());
    const row: ProductInsert = {
      id,
      environment: "live",
      name: "Factory product",
      code: `p-${id.slice(-10).toLowerCase()}`,
      status: "active",
      signingStatus: "pending",
      createdAt: now(),
      updatedAt: now(),
      ...overrides,
    };
    return db.insert(products).values(row).returning().get();
  }

  function policy(overrides: Partial<PolicyInsert> & { productId: string }) {
    const d = policyDefaults("perpetual", t.workspace.plan());
    const row: PolicyInsert = {
      id: ids.next("policy", now().getTime()),
      environment: "live",
      name: "Factory policy",
      status: "active",
      licenseType: d.license_type,
      validationMode: d.validation_mode,
      failMode: d.fail_mode,
      identityMode: d.identity_mode,
      perpetualMode: d.perpetual_mode,
      concurrencyUnit: d.concurrency_unit,
      renewalAuthority: d.renewal_authority,
      billingCycle: d.billing_cycle,
      fingerprintProfile: d.fingerprint_profile,
      heartbeatRequired: d.heartbeat_required,
      maxMachines: d.max_machines,
      maxConcurrent: d.max_concurrent,
      licenseUnitLimit: d.license_unit_limit,
      certTtlSec: d.cert_ttl_sec,
      heartbeatSec: d.heartbeat_sec,
      leaseTtlSec: d.lease_ttl_sec,
      leaseHeartbeatSec: d.lease_heartbeat_sec,
      networkGraceSec: d.network_grace_sec,
      trialDays: d.trial_days,
      entitlements: {},
      createdAt: now(),
      updatedAt: now(),
      ...overrides,
    };
    return db.insert(policies).values(row).returning().get();
  }

  function customer(overrides: Partial<CustomerInsert> = {}) {
    const row: CustomerInsert = {
      id: ids.next("customer", now().getTime()),
      name: "Factory customer",
      email: "customer@example.com",
      status: "active",
      createdAt: now(),
      updatedAt: now(),
      ...overrides,
    };
    return db.insert(customers).values(row).returning().get();
  }

  function license(overrides: Partial<LicenseInsert> & { productId: string; policyId: string }) {
    const id = overrides.id ?? ids.next("license", now().getTime());
    const key = canonicalLicenseKey(generateLicenseKey()) as string;
    const row: LicenseInsert = {
      id,
      environment: "live",
      keyCiphertext: secrets.encrypt(key, `license-key:${id}`),
      keyLookup: secrets.lookupHash(key, "license-key"),
      licenseType: "perpetual",
      status: "active",
      renewalAuthority: "vendor",
      entitlements: {},
      metadata: {},
      createdAt: now(),
      updatedAt: now(),
      ...overrides,
    };
    return { row: db.insert(licenses).values(row).returning().get(), key };
  }

  function reseller(overrides: Partial<ResellerInsert> = {}) {
    const row: ResellerInsert = {
      id: ids.next("reseller", now().getTime()),
      name: "Factory reseller",
      status: "active",
      metadata: {},
      createdAt: now(),
      updatedAt: now(),
      ...overrides,
    };
    return db.insert(resellers).values(row).returning().get();
  }

  /** An activation row with a made-up device key, for management-side tests. */
  function activation(overrides: Partial<ActivationInsert> & { productId: string; licenseId: string }) {
    const row: ActivationInsert = {
      id: ids.next("activation", now().getTime()),
      environment: "live",
      status: "active",
      deviceSigningKey: "ed25519:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
      deviceThumbprint: "0".repeat(64),
      deviceKemKey: "p256:AAAA",
      machineInfo: { os: "linux", arch: "x64" },
      machineInfoDigest: "0".repeat(64),
      machineBaselineAt: now(),
      machineSignals: {},
      activatedAt: now(),
      lastSeenAt: now(),
      certificateExpiresAt: now(),
      ...overrides,
    };
    return db.insert(activations).values(row).returning().get();
  }

  function deviceBlock(overrides: Partial<DeviceBlockInsert> & { target: string }) {
    const row: DeviceBlockInsert = {
      id: ids.next("block", now().getTime()),
      environment: "live",
      kind: "license",
      createdAt: now(),
      ...overrides,
    };
    return db.insert(deviceBlocks).values(row).returning().get();
  }

  /** A product with one policy, the shape most license tests start from. */
  function catalog(environment: "live" | "test" = "live", policyOverrides: Partial<PolicyInsert> = {}) {
    const p = product({ environment });
    const pol = policy({ productId: p.id, environment, ...policyOverrides });
    return { product: p, policy: pol };
  }

  return { product, policy, customer, license, reseller, activation, deviceBlock, catalog };
}
