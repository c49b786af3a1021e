import { afterEach, beforeEach, expect, test } from "bun:test";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepOnce, sweepVerifications } from "../../src/jobs/sweeper.ts";
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

test("the verification purge drops email verifications, their passkey approvals and named-user tokens older than two days, and keeps younger ones", async () => {
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
  expect((await sweepVerifications(services, silentLogger)).email_verifications).toBe(0);
  expect(counts()).toEqual([3, 3, 1]);
  // The token lasted 5 minutes past its verification: it goes two days after it expired.
  t.clock.advance(61 + 300);
  // One verification (with its approval) per batch: the first at once, the next after a turn.
  const pass = services.emailVerifications.purge(1);
  expect(counts()).toEqual([2, 2, 1]);
  expect(await pass).toBe(5);
  expect(counts()).toEqual([1, 1, 0]);
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

test("device nonces are kept in arrival order with one key index: a call writes the table's last page and one page of the key", () => {
  const table = t.deps.sqlite
    .query<{ sql: string }, []>(
      "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'device_nonces'",
    )
    .get();
  expect(table?.sql).toContain("`id` integer PRIMARY KEY");
  expect(table?.sql).not.toContain("WITHOUT ROWID");
  const indexes = t.deps.sqlite
    .query<{ name: string; sql: string }, []>(
      "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'device_nonces'",
    )
    .all();
  expect(indexes.map((index) => index.name)).toEqual(["device_nonces_key"]);
  expect(indexes[0]?.sql).toContain("UNIQUE INDEX");
});

test("a nonce inside the window is never purged, even when older ones arrived after it (a clock set back)", () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const nowSec = Math.floor(t.clock.now().getTime() / 1000);
  const insert = t.deps.sqlite.prepare(
    "INSERT INTO device_nonces (activation_id, nonce, seen_at) VALUES (?, ?, ?)",
  );
  insert.run("act_young", "first-in", nowSec - 10);
  for (let i = 0; i < 6; i++) insert.run(`act_${i}`, "n", nowSec - 700 - i * 10);
  insert.run("act_young", "last-in", nowSec - 5);
  // The batch reads the first 4 rows: the young one is kept, the three old ones behind it go.
  expect(services.runtimeGate.purgeNonces(4)).toBe(3);
  expect(services.runtimeGate.purgeNonces()).toBe(3);
  const left = t.deps.sqlite
    .query<{ nonce: string }, []>("SELECT nonce FROM device_nonces ORDER BY id")
    .all()
    .map((row) => row.nonce);
  expect(left).toEqual(["first-in", "last-in"]);
  // Only rows inside the window are left: nothing is deleted.
  expect(services.runtimeGate.purgeNonces()).toBe(0);
});

test("an unlimited purge removes every expired nonce, more than one statement's batch, and keeps the live ones", () => {
  const services = createServices(t.deps, { baseUrl: BASE_URL });
  const nowSec = Math.floor(t.clock.now().getTime() / 1000);
  const insert = t.deps.sqlite.prepare(
    "INSERT INTO device_nonces (activation_id, nonce, seen_at) VALUES (?, ?, ?)",
  );
  t.deps.sqlite.transaction(() => {
    for (let i = 0; i < 4_500; i++)
      insert.run(`act_${i % 50}`, `old-${i}`, nowSec - 900 + Math.floor(i / 100));
    for (let i = 0; i < 20; i++) insert.run(`act_${i}`, `live-${i}`, nowSec - 30);
  })();
  expect(services.runtimeGate.purgeNonces()).toBe(4_500);
  expect(count("device_nonces")).toBe(20);
});
