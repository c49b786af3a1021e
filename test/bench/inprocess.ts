import { TestDevice } from "../support/device.ts";
import { createTestContext } from "../support/harness.ts";
import { activatedDevice, heartbeatPath, nowSec, runtimeFixture } from "../support/runtime.ts";

/**
 * A quick in-process measure of one route's server-side cost (no HTTP, no load generator):
 * heartbeats or activations through `app.handle` with requests signed beforehand. For
 * before/after comparisons while working on the hot path; `npm run bench` is the real measure.
 *
 * Usage: bun test/bench/inprocess.ts [heartbeat|activation|time] [N]
 */
const route = process.argv[2] ?? "heartbeat";
const n = Number(process.argv[3] ?? 3000);
const t = createTestContext();
const fixture = await runtimeFixture(t, {
  policy: { max_machines: 1_000_000, heartbeat_required: true, heartbeat_sec: 3600 },
});
const devices: Awaited<ReturnType<typeof activatedDevice>>[] = [];
for (let i = 0; i < 200; i++) devices.push(await activatedDevice(t, fixture));

function heartbeatRequest(i: number): Request {
  const { device, activationId, response } = devices[i % devices.length] as (typeof devices)[number];
  const path = heartbeatPath(activationId);
  // The common check-in: the digest of the baseline the device activated with.
  const text = JSON.stringify({ machine_info_digest: response.body.data.machine_info_digest });
  const headers = {
    ...device.proofHeaders("POST", path, activationId, text, { timestamp: nowSec(t) }),
    "content-type": "application/json",
  };
  return new Request(`http://licensing.test${path}`, { method: "POST", headers, body: text });
}

async function run(label: string, requests: Request[]) {
  const started = performance.now();
  const cpuBefore = process.cpuUsage();
  let failures = 0;
  for (const request of requests) {
    const response = await t.app.handle(request);
    await response.arrayBuffer();
    if (response.status >= 300) failures++;
  }
  const us = ((performance.now() - started) * 1000) / requests.length;
  const cpu = process.cpuUsage(cpuBefore);
  const cpuUs = (cpu.user + cpu.system) / requests.length;
  // CPU time is the steadier figure on a shared machine; wall time includes waiting for a core.
  console.log(
    `${label}: ${cpuUs.toFixed(1)} CPU µs/request, ${us.toFixed(1)} wall µs (${requests.length}, ${failures} failed)`,
  );
}

if (route === "heartbeat") {
  for (let round = 0; round < 3; round++) {
    const requests = Array.from({ length: n }, (_, i) => heartbeatRequest(i));
    await run(`heartbeat round ${round + 1}`, requests);
  }
}
if (route === "activation") {
  for (let round = 0; round < 3; round++) {
    const requests = Array.from({ length: n }, (_, i) => {
      const body = new TestDevice().activationBody({
        licenseKey: fixture.licenseKey,
        productId: fixture.productId,
        clientTime: nowSec(t),
      });
      return new Request("http://licensing.test/runtime/v1/activations", {
        method: "POST",
        headers: {
          "content-type": "application/json",
          "idempotency-key": `bench-activation-${round}-${i}-key`,
        },
        body: JSON.stringify(body),
      });
    });
    await run(`activation round ${round + 1}`, requests);
  }
}
if (route === "time") {
  for (let round = 0; round < 3; round++) {
    const requests = Array.from(
      { length: n },
      (_, i) =>
        new Request("http://licensing.test/runtime/v1/time", {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({
            product_id: fixture.productId,
            nonce: `nonce-${round}-${i}-abcdefghijklmnop`,
            sdk_version: "1.0.0",
          }),
        }),
    );
    await run(`time round ${round + 1}`, requests);
  }
}
t.close();
