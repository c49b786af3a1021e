import { Database, type Statement } from "bun:sqlite";
import { statSync } from "node:fs";
import { TestDevice } from "../support/device.ts";
import { createTestContext } from "../support/harness.ts";
import { activatedDevice, heartbeatPath, nowSec, runtimeFixture } from "../support/runtime.ts";

/**
 * Which SQL one heartbeat and one activation run, and how many WAL frames (pages) each writes:
 * the statements of bun:sqlite are wrapped to log themselves while a request goes through
 * app.handle. For finding avoidable reads and writes on the hot paths.
 *
 * Usage: bun test/bench/sqltrace.ts   (TRACE_STACK=<sql text> also prints who ran matching SQL)
 */
const log: string[] = [];
let tracing = false;
const wrapped = new WeakSet<object>();
for (const factory of ["prepare", "query"] as const) {
  const original = Database.prototype[factory] as (...args: unknown[]) => Statement;
  (Database.prototype as unknown as Record<string, unknown>)[factory] = function (
    this: Database,
    ...args: unknown[]
  ) {
    const statement = original.apply(this, args);
    // query() hands back the same cached statement: wrap it once.
    if (wrapped.has(statement)) return statement;
    wrapped.add(statement);
    const sqlText = String(args[0]).replace(/\s+/g, " ").slice(0, 170);
    for (const method of ["run", "get", "all", "values"] as const) {
      const bound = (statement[method] as (...a: unknown[]) => unknown).bind(statement);
      (statement as unknown as Record<string, unknown>)[method] = (...a: unknown[]) => {
        if (tracing) log.push(`${method}: ${sqlText}`);
        if (tracing && process.env.TRACE_STACK && sqlText.includes(process.env.TRACE_STACK))
          log.push(String(new Error().stack).split("\n").slice(2, 9).join("\n"));
        return bound(...a);
      };
    }
    return statement;
  };
}
const originalRun = Database.prototype.run as (...args: unknown[]) => unknown;
(Database.prototype as unknown as Record<string, unknown>).run = function (
  this: Database,
  ...args: unknown[]
) {
  if (tracing) log.push(`db.run: ${String(args[0]).slice(0, 120)}`);
  return originalRun.apply(this, args);
};

const t = createTestContext();
t.deps.sqlite.run("PRAGMA wal_autocheckpoint = 0");
const fixture = await runtimeFixture(t, {
  policy: { max_machines: 1_000_000, heartbeat_required: true, heartbeat_sec: 3600 },
});
const devices = [];
for (let i = 0; i < 50; i++) devices.push(await activatedDevice(t, fixture));
const walPath = `${t.deps.sqlite.filename}-wal`;
const walFrames = () => Math.max(0, (statSync(walPath).size - 32) / (4096 + 24));

async function traced(label: string, request: Request) {
  t.deps.sqlite.run("PRAGMA wal_checkpoint(TRUNCATE)");
  log.length = 0;
  tracing = true;
  const response = await t.app.handle(request);
  await response.arrayBuffer();
  tracing = false;
  console.log(`== ${label}: ${response.status}, ${walFrames()} WAL frames`);
  for (const line of log) console.log(`  ${line}`);
}

const { device, activationId, response } = devices[7] as (typeof devices)[number];
const path = heartbeatPath(activationId);
const text = JSON.stringify({ machine_info_digest: response.body.data.machine_info_digest });
await traced(
  "heartbeat",
  new Request(`http://licensing.test${path}`, {
    method: "POST",
    headers: {
      ...device.proofHeaders("POST", path, activationId, text, { timestamp: nowSec(t) }),
      "content-type": "application/json",
    },
    body: text,
  }),
);
const body = new TestDevice().activationBody({
  licenseKey: fixture.licenseKey,
  productId: fixture.productId,
  clientTime: nowSec(t),
});
await traced(
  "activation",
  new Request("http://licensing.test/runtime/v1/activations", {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": "trace-activation-key-1" },
    body: JSON.stringify(body),
  }),
);
t.close();
