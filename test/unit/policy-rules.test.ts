import { describe, expect, test } from "bun:test";
import { FEATURES, hasFeature, minimumPlanFor, PLANS, type PlanDefinition } from "../../src/domain/plans.ts";
import {
  LICENSE_TYPES,
  type LicenseType,
  type PolicySettings,
  policyDefaults,
  policyViolations,
  revocationExposureSec,
} from "../../src/domain/policy-rules.ts";

const DAY = 86_400;
const free = PLANS.free as PlanDefinition;
const selfHosted = PLANS.self_hosted as PlanDefinition;

const policy = (
  plan: PlanDefinition,
  overrides: Partial<PolicySettings> = {},
  kind: LicenseType = "subscription",
) => ({
  ...policyDefaults(kind, plan),
  ...overrides,
});

const fields = (p: PolicySettings, plan: PlanDefinition) => Object.keys(policyViolations(p, plan)).sort();

describe("policyDefaults", () => {
  for (const plan of Object.values(PLANS)) {
    for (const kind of LICENSE_TYPES) {
      test(`the default ${kind} policy on the ${plan.code} plan breaks none of its rules`, () => {
        const defaults = policyDefaults(kind, plan);
        expect(defaults.license_type).toBe(kind);
        expect(policyViolations(defaults, plan)).toEqual({});
      });
    }
  }

  test("a default trial runs for at least one day and other kinds have no trial days", () => {
    expect(policyDefaults("trial", free).trial_days).toBeGreaterThanOrEqual(1);
    expect(policyDefaults("perpetual", free).trial_days).toBe(0);
    expect(policyDefaults("subscription", free).trial_days).toBe(0);
  });

  test("the default heartbeat is never below the plan's smallest sync interval", () => {
    for (const plan of Object.values(PLANS)) {
      expect(policyDefaults("subscription", plan).heartbeat_sec).toBeGreaterThanOrEqual(
        plan.policy_constraints.activation_sync_min_sec,
      );
    }
  });
});

describe("policyViolations", () => {
  test("a heartbeat below the plan's activation_sync_min_sec is an error on heartbeat_sec", () => {
    const min = free.policy_constraints.activation_sync_min_sec;
    expect(fields(policy(free, { heartbeat_sec: min - 1 }), free)).toEqual(["heartbeat_sec"]);
    expect(policyViolations(policy(free, { heartbeat_sec: min - 1 }), free).heartbeat_sec?.[0]).toContain(
      "activation_sync_min_sec",
    );
    expect(fields(policy(free, { heartbeat_sec: min }), free)).toEqual([]);
  });

  test("a certificate lifetime above the plan's cert_ttl_max_sec is an error on cert_ttl_sec", () => {
    const max = selfHosted.policy_constraints.cert_ttl_max_sec;
    const p = policy(selfHosted, { cert_ttl_sec: max + 1, fail_mode: "closed" });
    const errors = policyViolations(p, selfHosted);
    expect(errors.cert_ttl_sec?.some((m) => m.includes("cert_ttl_max_sec"))).toBe(true);
    expect(Object.keys(errors)).toEqual(["cert_ttl_sec"]);
    expect(fields(policy(selfHosted, { cert_ttl_sec: max, fail_mode: "closed" }), selfHosted)).toEqual([]);
  });

  test("a certificate lifetime under five minutes is an error on cert_ttl_sec", () => {
    const p = policy(selfHosted, { cert_ttl_sec: 299, heartbeat_sec: 60 });
    expect(fields(p, selfHosted)).toEqual(["cert_ttl_sec"]);
  });

  test("a lease heartbeat equal to or longer than the lease lifetime is an error on lease_heartbeat_sec", () => {
    expect(fields(policy(free, { lease_ttl_sec: 900, lease_heartbeat_sec: 900 }), free)).toEqual([
      "lease_heartbeat_sec",
    ]);
    expect(fields(policy(free, { lease_ttl_sec: 900, lease_heartbeat_sec: 901 }), free)).toEqual([
      "lease_heartbeat_sec",
    ]);
    expect(fields(policy(free, { lease_ttl_sec: 900, lease_heartbeat_sec: 899 }), free)).toEqual([]);
  });

  test("a heartbeat longer than the certificate lifetime is an error on heartbeat_sec", () => {
    const p = policy(selfHosted, { cert_ttl_sec: 600, heartbeat_sec: 601 });
    expect(fields(p, selfHosted)).toEqual(["heartbeat_sec"]);
    expect(policyViolations(p, selfHosted).heartbeat_sec?.[0]).toContain("cert_ttl_sec");
    expect(fields(policy(selfHosted, { cert_ttl_sec: 600, heartbeat_sec: 600 }), selfHosted)).toEqual([]);
  });

  test("revocation exposure over the plan maximum blames cert_ttl_sec and network_grace_sec when failing open", () => {
    // free: revocation_exposure_max_sec = cert_ttl_max_sec = 14 days.
    const p = policy(free, { fail_mode: "open", cert_ttl_sec: 12 * DAY, network_grace_sec: 3 * DAY });
    const errors = policyViolations(p, free);
    expect(Object.keys(errors).sort()).toEqual(["cert_ttl_sec", "network_grace_sec"]);
    expect(errors.cert_ttl_sec?.[0]).toContain("revocation_exposure_max_sec");
    expect(errors.network_grace_sec?.[0]).toContain("revocation_exposure_max_sec");
  });

  test("revocation exposure exactly at the plan maximum is allowed", () => {
    const p = policy(free, { fail_mode: "open", cert_ttl_sec: 12 * DAY, network_grace_sec: 2 * DAY });
    expect(revocationExposureSec(p)).toBe(14 * DAY);
    expect(policyViolations(p, free)).toEqual({});
  });

  test("a policy that fails closed does not count the network grace in its revocation exposure", () => {
    const p = policy(free, { fail_mode: "closed", cert_ttl_sec: 12 * DAY, network_grace_sec: 30 * DAY });
    expect(revocationExposureSec(p)).toBe(12 * DAY);
    expect(policyViolations(p, free)).toEqual({});
    expect(revocationExposureSec({ ...p, fail_mode: "open" })).toBe(42 * DAY);
  });

  test("failing closed with the certificate alone over the exposure limit blames only cert_ttl_sec", () => {
    const p = policy(free, { fail_mode: "closed", cert_ttl_sec: 14 * DAY + 1, network_grace_sec: 0 });
    const errors = policyViolations(p, free);
    expect(Object.keys(errors)).toEqual(["cert_ttl_sec"]);
    expect(errors.cert_ttl_sec?.some((m) => m.includes("revocation_exposure_max_sec"))).toBe(true);
  });

  test("unmanaged perpetual mode on a license that is not perpetual is an error on perpetual_mode", () => {
    for (const kind of ["subscription", "trial"] as const) {
      expect(fields(policy(free, { perpetual_mode: "unmanaged" }, kind), free)).toEqual(["perpetual_mode"]);
    }
    expect(fields(policy(free, { perpetual_mode: "unmanaged" }, "perpetual"), free)).toEqual([]);
  });

  test("a named-user policy that no device could use online is an error on identity_mode", () => {
    const named = { identity_mode: "named_user" } as const;
    expect(fields(policy(selfHosted, { ...named, validation_mode: "offline" }), selfHosted)).toEqual([
      "identity_mode",
    ]);
    expect(
      fields(policy(selfHosted, { ...named, perpetual_mode: "unmanaged" }, "perpetual"), selfHosted),
    ).toEqual(["identity_mode"]);
    for (const validation_mode of ["online", "hybrid"] as const)
      expect(fields(policy(selfHosted, { ...named, validation_mode }), selfHosted)).toEqual([]);
    expect(fields(policy(selfHosted, { validation_mode: "offline" }), selfHosted)).toEqual([]);
  });

  test("a trial with zero trial days is an error on trial_days", () => {
    expect(fields(policy(free, { trial_days: 0 }, "trial"), free)).toEqual(["trial_days"]);
    expect(fields(policy(free, { trial_days: 1 }, "trial"), free)).toEqual([]);
    expect(fields(policy(free, { trial_days: 0 }, "perpetual"), free)).toEqual([]);
    expect(fields(policy(free, { trial_days: 366 }, "trial"), free)).toEqual(["trial_days"]);
  });

  test("trials and perpetual licenses cannot have a billing cycle", () => {
    expect(fields(policy(free, { billing_cycle: "monthly" }, "trial"), free)).toEqual(["billing_cycle"]);
    expect(fields(policy(free, { billing_cycle: "yearly" }, "perpetual"), free)).toEqual(["billing_cycle"]);
    expect(fields(policy(free, { billing_cycle: "quarterly" }, "subscription"), free)).toEqual([]);
  });

  test("machine and seat counts below one are errors on their own fields", () => {
    expect(fields(policy(free, { max_machines: 0 }), free)).toEqual(["max_machines"]);
    expect(fields(policy(free, { max_concurrent: 0 }), free)).toEqual(["max_concurrent"]);
    expect(fields(policy(free, { license_unit_limit: 0 }), free)).toEqual(["license_unit_limit"]);
    expect(fields(policy(free, { max_concurrent: null, license_unit_limit: null }), free)).toEqual([]);
  });

  test("badly formed entitlement names are errors keyed by the entitlement's path", () => {
    const bad = ["Pro", "has space", "_leading", "-leading", "", "x".repeat(65), "emoji\u{1f600}"];
    const good = ["pro", "9lives", "feature.export", "a:b-c_d", "x".repeat(64)];
    const entitlements = Object.fromEntries([...bad, ...good].map((name) => [name, true]));
    const errors = policyViolations(policy(free, { entitlements }), free);
    expect(Object.keys(errors).sort()).toEqual(bad.map((name) => `entitlements.${name}`).sort());
  });

  test("more than two hundred entitlements is an error on entitlements", () => {
    const entitlements = Object.fromEntries(Array.from({ length: 201 }, (_, i) => [`e${i}`, true]));
    expect(fields(policy(free, { entitlements }), free)).toEqual(["entitlements"]);
    delete entitlements.e0;
    expect(fields(policy(free, { entitlements }), free)).toEqual([]);
  });

  test("entitlement values whose numbers leave I-JSON are errors keyed by the value's path", () => {
    const max = Number.MAX_SAFE_INTEGER;
    const entitlements = {
      seats: 1.5,
      big: 1e308,
      rounded: 2 ** 53,
      low: -(2 ** 53),
      limits: { projects: { max: 0.5 }, users: 5 },
      tiers: [1, 2.5],
    };
    const errors = policyViolations(policy(free, { entitlements }), free);
    expect(Object.keys(errors).sort()).toEqual([
      "entitlements.big",
      "entitlements.limits.projects.max",
      "entitlements.low",
      "entitlements.rounded",
      "entitlements.seats",
      "entitlements.tiers.1",
    ]);
    expect(errors["entitlements.seats"]?.[0]).toContain("integers between");
    const fine = {
      pro: true,
      beta: false,
      seats: 50,
      edge: max,
      negative: -max,
      tier: "gold",
      none: null,
      limits: { projects: { max: 10 } },
      list: [1, "a", false, null],
    };
    expect(policyViolations(policy(free, { entitlements: fine }), free)).toEqual({});
  });

  test("several broken rules are all reported at once", () => {
    const p = policy(free, { heartbeat_sec: 10, max_machines: 0, perpetual_mode: "unmanaged" });
    expect(fields(p, free)).toEqual(["heartbeat_sec", "max_machines", "perpetual_mode"]);
  });

  test("the same policy can be valid on a larger plan and invalid on a smaller one", () => {
    const p = policy(selfHosted, { heartbeat_sec: 120, cert_ttl_sec: 20 * DAY });
    expect(policyViolations(p, selfHosted)).toEqual({});
    expect(fields(p, free)).toEqual(["cert_ttl_sec", "heartbeat_sec", "network_grace_sec"]);
  });
});

describe("plans", () => {
  test("minimumPlanFor names the cheapest plan that offers each feature", () => {
    expect(minimumPlanFor("offline_packages").code).toBe("free");
    expect(minimumPlanFor("webhooks").code).toBe("personal");
    expect(minimumPlanFor("email_license_verification").code).toBe("personal");
    expect(minimumPlanFor("trial_licenses").code).toBe("business");
    expect(minimumPlanFor("sealed_files").code).toBe("business");
    expect(minimumPlanFor("browser_runtime").code).toBe("business");
    expect(minimumPlanFor("billing_integration").code).toBe("business");
  });

  test("the plan minimumPlanFor names has the feature and no cheaper plan does", () => {
    for (const feature of FEATURES) {
      const cheapest = minimumPlanFor(feature);
      expect(hasFeature(cheapest, feature)).toBe(true);
      for (const plan of Object.values(PLANS)) {
        if (plan.rank < cheapest.rank) expect(hasFeature(plan, feature)).toBe(false);
      }
    }
  });

  test("hasFeature answers from the plan's feature list", () => {
    expect(hasFeature(free, "offline_packages")).toBe(true);
    expect(hasFeature(free, "webhooks")).toBe(false);
    expect(hasFeature(PLANS.personal as PlanDefinition, "webhooks")).toBe(true);
    expect(hasFeature(PLANS.personal as PlanDefinition, "sealed_files")).toBe(false);
  });

  test("the self-hosted plan has every feature", () => {
    for (const feature of FEATURES) expect(hasFeature(selfHosted, feature)).toBe(true);
  });
});
