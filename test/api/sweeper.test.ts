import { afterEach, beforeEach, expect, test } from "bun:test";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce } from "../../src/jobs/sweeper.ts";
import { mailPayloadContext } from "../../src/mail/outbox.ts";
import { createServices } from "../../src/services.ts";
import { TestDevice } from "../support/device.ts";
import { factories } from "../support/factories.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { confirmVerification, namedUserFixture, startVerification } from "../support/named-users.ts";

let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const count = (table: string) =>
  (t.deps.sqlite.query(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;

test("a sweep drops idempotency records older than 24 hours and keeps younger ones", async () => {
  await t.call("POST", "/mgmt/v1/products", {
    body: { name: "A", code: "a", environment: "live" },
    headers: t.idem(),
  });
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  sweepOnce(services, silentLogger);
  expect(count("idempotency_records")).toBe(1);
  t.clock.advance(24 * 3600 + 1);
  sweepOnce(services, silentLogger);
  expect(count("idempotency_records")).toBe(0);
});

test("a sweep drops runtime events last seen more than 7 days ago", () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const { product } = factories(t).catalog();
  services.runtimeEvents.record({
    environment: "live",
    operation: "heartbeat",
    code: "CLOCK_SKEW",
    httpStatus: 401,
    productId: product.id,
    requestId: "req_x",
  });
  t.clock.advance(6 * 86_400);
  sweepOnce(services, silentLogger);
  expect(count("runtime_events")).toBe(1);
  t.clock.advance(86_400 + 1);
  sweepOnce(services, silentLogger);
  expect(count("runtime_events")).toBe(0);
});

test("a sweep gives a product left pending its signing key and bundle", async () => {
  const pending = factories(t).product({ signingStatus: "pending" });
  const before = await t.call("GET", `/runtime/v1/products/${pending.id}/trust-bundle`, { key: null });
  expect(before.status).toBe(409);
  expect(before.body.error.code).toBe("SIGNING_KEY_PENDING");
  sweepOnce(createServices(t.deps, { baseUrl: BASE_URL }), silentLogger);
  const after = await t.call("GET", `/runtime/v1/products/${pending.id}/trust-bundle`, { key: null });
  expect(after.status).toBe(200);
  expect(after.body.data.bundle.signing_keys).toHaveLength(1);
  expect((await t.call("GET", `/mgmt/v1/products/${pending.id}`)).body.data.signing_status).toBe("ready");
});

test("a sweep drops email verifications, their passkey approvals and named-user tokens older than two days, and keeps younger ones", async () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const f = await namedUserFixture(t);
  const device = new TestDevice();
  const codeOf = async () => {
    // The code is only in the outbox (no SMTP here): read it back from the encrypted payload.
    const row = t.deps.sqlite
      .query<{ id: string; payload: string }, []>(
        "SELECT id, payload FROM mail_outbox WHERE status = 'pending' ORDER BY id DESC LIMIT 1",
      )
      .get();
    if (!row) throw new Error("no mail");
    return JSON.parse(t.deps.secrets.decrypt(row.payload, mailPayloadContext(row.id))).code as string;
  };
  const old = await startVerification(t, device, f, f.email);
  const token = await confirmVerification(t, device, old.body.data.verification_id, await codeOf());
  expect(token.status).toBe(200);
  await startVerification(t, device, f, "nobody@example.com");
  const counts = () => [count("email_verifications"), count("passkey_approvals"), count("named_user_tokens")];
  expect(counts()).toEqual([2, 2, 1]);
  t.clock.advance(2 * 86_400 - 60);
  await startVerification(t, device, f, f.email);
  sweepOnce(services, silentLogger);
  expect(counts()).toEqual([3, 3, 1]);
  // The token lasted 5 minutes past its verification: it goes two days after it expired.
  t.clock.advance(61 + 300);
  const done = sweepOnce(services, silentLogger);
  expect(counts()).toEqual([1, 1, 0]);
  expect(done.email_verifications).toBe(5);
});

test("device nonces past the replay window are purged in batches no larger than asked, newer ones kept", () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const nowSec = Math.floor(t.clock.now().getTime() / 1000);
  const insert = t.deps.sqlite.prepare(
    "INSERT INTO device_nonces (activation_id, nonce, seen_at) VALUES (?, ?, ?)",
  );
  for (let i = 0; i < 25; i++) insert.run("act_old", `old-nonce-${i}`, nowSec - 601 - i);
  for (let i = 0; i < 5; i++) insert.run("act_new", `new-nonce-${i}`, nowSec - 599 + i);
  expect(services.runtimeGate.purgeNonces(10)).toBe(10);
  expect(count("device_nonces")).toBe(20);
  expect(services.runtimeGate.purgeNonces(10)).toBe(10);
  expect(services.runtimeGate.purgeNonces(10)).toBe(5);
  expect(services.runtimeGate.purgeNonces(10)).toBe(0);
  expect(count("device_nonces")).toBe(5);
});

test("device nonces are kept in a WITHOUT ROWID table (two B-trees per insert), oldest purged first", () => {
  const table = t.deps.sqlite
    .query<{ sql: string }, []>(
      "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'device_nonces'",
    )
    .get();
  expect(table?.sql).toContain("WITHOUT ROWID");
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const nowSec = Math.floor(t.clock.now().getTime() / 1000);
  const insert = t.deps.sqlite.prepare(
    "INSERT INTO device_nonces (activation_id, nonce, seen_at) VALUES (?, ?, ?)",
  );
  // Keys in the opposite order of age: the purge must follow seen_at, not the key.
  for (let i = 0; i < 6; i++) insert.run(`act_${9 - i}`, "n", nowSec - 700 - i * 10);
  expect(services.runtimeGate.purgeNonces(3)).toBe(3);
  const left = t.deps.sqlite
    .query<{ seen_at: number }, []>("SELECT seen_at FROM device_nonces ORDER BY seen_at")
    .all()
    .map((row) => nowSec - row.seen_at);
  expect(left).toEqual([720, 710, 700]);
});
