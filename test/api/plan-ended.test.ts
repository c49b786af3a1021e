import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { machineInfoDigest } from "../../src/modules/activations/machine.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import {
  activatedDevice,
  heartbeatPath,
  proofCall,
  type RuntimeFixture,
  runtimeFixture,
} from "../support/runtime.ts";

/**
 * A workspace plan with an end (spec §2.4 `plan.ends_at`, §4.1, §7.2): afterwards every Runtime and
 * Management operation answers 402 PLAN_ENDED, except GET /mgmt/v1/plan, so the vendor sees why.
 */
let t: TestContext;
let fx: RuntimeFixture;
beforeEach(async () => {
  t = createTestContext();
  fx = await runtimeFixture(t);
});
afterEach(() => t.close());

const HOUR = 3_600;
const inOneHour = () => new Date(t.clock.now().getTime() + HOUR * 1000);
const DIGEST = machineInfoDigest({ os: "linux", arch: "x64" });

/** Runs the command line in this process against the test's data dir, capturing what it prints. */
const cli = (args: string[]) => runInProcess([...args, "--data-dir", t.dir], t.dir);

function expectPlanEnded(response: { status: number; body: { error: Record<string, unknown> } }) {
  expect(response.status).toBe(402);
  expect(response.body.error).toMatchObject({ code: "PLAN_ENDED", retryable: false });
  expect(Object.keys(response.body.error).sort()).toEqual(
    ["code", "details", "doc_url", "message", "request_id", "retryable"].sort(),
  );
}

describe("before the end", () => {
  test("the plan report states the end and whether the plan is a trial, and everything answers", async () => {
    // A second before the end must stay before it, however long the activation takes.
    t.clock.freeze();
    const endsAt = inOneHour();
    t.workspace.setPlan("business", undefined, { endsAt, trial: true });
    const plan = (await t.call("GET", "/mgmt/v1/plan")).body.data.plan;
    expect(plan).toEqual({ code: "business", name: "Business", trial: true, ends_at: endsAt.toISOString() });
    expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
    const { device, activationId } = await activatedDevice(t, fx);
    t.clock.advance(HOUR - 1);
    const beat = await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
      machine_info_digest: DIGEST,
    });
    expect(beat.status).toBe(200);
  });

  test("a plan without an end reports ends_at null and never answers 402", async () => {
    t.workspace.setPlan("free");
    t.clock.advance(100 * 365 * 86_400);
    const plan = (await t.call("GET", "/mgmt/v1/plan")).body.data.plan;
    expect(plan).toMatchObject({ code: "free", trial: false, ends_at: null });
    expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  });
});

describe("after the end", () => {
  test("every management and runtime operation answers 402 PLAN_ENDED; GET /mgmt/v1/plan still answers", async () => {
    const { device, activationId } = await activatedDevice(t, fx);
    const endsAt = inOneHour();
    t.workspace.setPlan("business", undefined, { endsAt, trial: true });
    t.clock.advance(HOUR);

    const products = await t.call("GET", "/mgmt/v1/products");
    expectPlanEnded(products);
    expect(products.body.error.details).toEqual({
      plan: "business",
      trial: true,
      ended_at: endsAt.toISOString(),
    });
    expect(products.body.error.message).toContain("trial");
    expectPlanEnded(
      await t.call("POST", "/mgmt/v1/customers", { body: { name: "Late" }, headers: t.idem() }),
    );
    expectPlanEnded(await t.call("GET", `/mgmt/v1/licenses/${fx.licenseId}`));
    expectPlanEnded(await t.call("GET", "/mgmt/v1/reports/usage"));
    expectPlanEnded(await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, { key: null }));
    expectPlanEnded(
      await t.call("POST", "/runtime/v1/time", {
        key: null,
        body: { product_id: fx.productId, nonce: "a-time-nonce-of-enough-length" },
      }),
    );
    expectPlanEnded(
      await proofCall(t, device, "POST", heartbeatPath(activationId), activationId, {
        machine_info_digest: DIGEST,
      }),
    );
    expectPlanEnded(await t.call("POST", "/runtime/v1/trial-verifications", { key: null, body: {} }));

    const plan = await t.call("GET", "/mgmt/v1/plan");
    expect(plan.status).toBe(200);
    expect(plan.body.data.plan.ends_at).not.toBeNull();
    // Health and the docs are not API operations.
    expect((await t.call("GET", "/healthz", { key: null })).status).toBe(200);
    expect((await t.call("GET", "/docs/errors", { key: null })).status).toBe(200);
  });

  test("the plan report still answers however the router serves it (HEAD, a trailing slash); other methods on its path do not", async () => {
    t.workspace.setPlan("business", undefined, { endsAt: inOneHour() });
    t.clock.advance(HOUR);
    const slash = await t.call("GET", "/mgmt/v1/plan/");
    expect(slash.status).toBe(200);
    expect(slash.body.data.plan.ends_at).not.toBeNull();
    expect((await t.call("HEAD", "/mgmt/v1/plan")).status).toBe(200);
    expect((await t.call("HEAD", "/mgmt/v1/plan/")).status).toBe(200);
    expectPlanEnded(await t.call("POST", "/mgmt/v1/plan", { body: {} }));
    expectPlanEnded(await t.call("GET", "/mgmt/v1/plan//"));
  });

  test("an unauthenticated or scope-less caller hears 401 or 403 first, not about the plan", async () => {
    t.workspace.setPlan("business", undefined, { endsAt: inOneHour() });
    t.clock.advance(HOUR);
    expect((await t.call("GET", "/mgmt/v1/products", { key: null })).status).toBe(401);
    const message = (await t.call("GET", "/mgmt/v1/products")).body.error.message;
    expect(message).toContain("subscription");
  });

  test("402 answers use up neither monthly allowance, and a new term lifts them at once", async () => {
    t.workspace.setPlan("free", undefined, { endsAt: inOneHour() });
    const quotas = async () => (await t.call("GET", "/mgmt/v1/plan")).body.data.quotas;
    const before = await quotas();
    t.clock.advance(HOUR);
    for (let i = 0; i < 3; i++) {
      expectPlanEnded(await t.call("GET", "/mgmt/v1/products"));
      expectPlanEnded(
        await t.call("GET", `/runtime/v1/products/${fx.productId}/trust-bundle`, { key: null }),
      );
    }
    const after = await quotas();
    expect(after.management_requests.used).toBe(before.management_requests.used);
    expect(after.runtime_requests.used).toBe(before.runtime_requests.used);
    t.workspace.setPlan("free");
    expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  });

  test("CORS preflights are still answered, so a browser can read the 402", async () => {
    t.workspace.setPlan("business", undefined, { endsAt: inOneHour() });
    t.clock.advance(HOUR);
    const preflight = await t.call("OPTIONS", "/runtime/v1/time", {
      key: null,
      headers: { origin: "https://app.example.com", "access-control-request-method": "POST" },
    });
    expect(preflight.status).not.toBe(402);
  });
});

describe("licensing plan set", () => {
  test("--ends-at and --trial set the term; the running service answers 402 from then on", async () => {
    const endsAt = inOneHour().toISOString();
    const set = await cli(["plan", "set", "business", "--trial", "--ends-at", endsAt]);
    expect(set.code).toBe(0);
    expect(set.stdout).toContain(`trial ending ${endsAt}`);
    expect((await t.call("GET", "/mgmt/v1/plan")).body.data.plan).toMatchObject({
      code: "business",
      trial: true,
      ends_at: endsAt,
    });
    const shown = await cli(["plan", "show", "--json"]);
    expect(JSON.parse(shown.stdout)).toMatchObject({ code: "business", trial: true, ends_at: endsAt });
    t.clock.advance(HOUR);
    expectPlanEnded(await t.call("GET", "/mgmt/v1/products"));
    // Setting a plan without --ends-at gives it no end.
    expect((await cli(["plan", "set", "business"])).code).toBe(0);
    expect((await t.call("GET", "/mgmt/v1/products")).status).toBe(200);
  });

  test("a bad --ends-at, or --trial without one, is a usage error that changes nothing", async () => {
    for (const args of [
      ["--ends-at", "2027-02-30T00:00:00Z"],
      ["--ends-at", "tomorrow"],
      ["--ends-at", "2027-01-01T00:00:00"],
      ["--trial"],
    ]) {
      const result = await cli(["plan", "set", "free", ...args]);
      expect(result.code).toBe(2);
      expect(result.stderr).toMatch(/--ends-at|--trial/);
    }
    expect((await t.call("GET", "/mgmt/v1/plan")).body.data.plan).toMatchObject({
      code: "self_hosted",
      ends_at: null,
    });
  });

  test("an --ends-at that has passed is a usage error that says what it would do, and changes nothing", async () => {
    for (const endsAt of ["2020-01-01T00:00:00Z", new Date(Date.now() - 1000).toISOString()]) {
      const result = await cli(["plan", "set", "business", "--ends-at", endsAt]);
      expect(result.code).toBe(2);
      expect(result.stdout).toBe("");
      expect(result.stderr).toContain(`--ends-at ${new Date(endsAt).toISOString()} has passed`);
      expect(result.stderr).toContain("402 PLAN_ENDED; add --allow-past to end it now on purpose");
    }
    expect((await t.call("GET", "/mgmt/v1/plan")).body.data.plan).toMatchObject({
      code: "self_hosted",
      ends_at: null,
    });
  });

  test("--allow-past ends the plan at once, on purpose; alone, without --ends-at, it is a usage error", async () => {
    const alone = await cli(["plan", "set", "business", "--allow-past"]);
    expect(alone.code).toBe(2);
    expect(alone.stderr).toContain("--allow-past goes with --ends-at");
    const set = await cli(["plan", "set", "business", "--ends-at", "2020-01-01T00:00:00Z", "--allow-past"]);
    expect(set.code).toBe(0);
    expect(set.stdout).toBe(
      "The workspace plan is now business (Business), ended 2020-01-01T00:00:00.000Z.\n",
    );
    expectPlanEnded(await t.call("GET", "/mgmt/v1/products"));
  });

  test("the change is audited with its term", async () => {
    const endsAt = inOneHour().toISOString();
    expect((await cli(["plan", "set", "personal", "--ends-at", endsAt])).code).toBe(0);
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data;
    expect(events[0]).toMatchObject({
      type: "workspace.plan_changed",
      actor: { type: "cli" },
      data: { plan: "personal", trial: false, ends_at: endsAt },
    });
  });
});
