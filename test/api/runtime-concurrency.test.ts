import { afterEach, beforeEach, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { activate, activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const count = (sql: string) => (t.deps.sqlite.query(sql).get() as { n: number }).n;

test("50 parallel activations against max_machines 5 leave exactly 5 activations", async () => {
  const fx = await runtimeFixture(t, { policy: { max_machines: 5 } });
  const responses = await Promise.all(Array.from({ length: 50 }, () => activate(t, new TestDevice(), fx)));
  expect(responses.filter((r) => r.status === 201)).toHaveLength(5);
  expect(
    responses.filter((r) => r.status === 409 && r.body.error.code === "MACHINE_LIMIT_REACHED"),
  ).toHaveLength(45);
  expect(count("SELECT count(*) AS n FROM activations WHERE status = 'active'")).toBe(5);
});

test("50 parallel lease requests against max_concurrent 3 leave exactly 3 leases", async () => {
  const fx = await runtimeFixture(t, {
    policy: { max_machines: 50, max_concurrent: 3, concurrency_unit: "instance" },
  });
  const devices = await Promise.all(Array.from({ length: 10 }, () => activatedDevice(t, fx)));
  const responses = await Promise.all(
    Array.from({ length: 50 }, (_, i) => {
      const d = devices[i % devices.length] as (typeof devices)[number];
      return proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
        activation_id: d.activationId,
        instance_id: `instance-${i}`,
      });
    }),
  );
  expect(responses.filter((r) => r.status === 201)).toHaveLength(3);
  expect(responses.filter((r) => r.status === 409)).toHaveLength(47);
  expect(count("SELECT count(*) AS n FROM leases WHERE status = 'active'")).toBe(3);
});
