import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { silentLogger } from "../../src/http/logger.ts";
import { sweepVerifications } from "../../src/jobs/sweeper.ts";
import type { MailTransport } from "../../src/mail/transport.ts";
import { MAIL_RETENTION_SEC, MailWorker } from "../../src/mail/worker.ts";
import { createServices } from "../../src/services.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { startTrial, trialFixture } from "../support/trials.ts";

/**
 * Purges of tables that unauthenticated starts write (trial and email verifications) and of the
 * mail outbox: in batches of a given size, a turn of the event loop between them, from the
 * sweeper or the mail worker, never inside a request. One DELETE of a backlog (100,000 trial
 * verifications after a restart) held the thread that serves heartbeats for over a second.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
});
afterEach(() => t.close());

const DAY_MS = 86_400_000;
const ids = (sql: string) =>
  t.deps.sqlite
    .query<{ id: string }, []>(sql)
    .all()
    .map((row) => row.id);

function insertTrialVerifications(productId: string, prefix: string, count: number, createdAt: number) {
  const insert = t.deps.sqlite.prepare(
    `INSERT INTO trial_verifications (id, environment, product_id, email_lookup, device_thumbprint, code_hash,
       attempts, sent, status, created_at, expires_at, used_at)
     VALUES (?, 'live', ?, 'lookup', 'thumb', 'hash', 0, 0, 'started', ?, ?, NULL)`,
  );
  for (let i = 0; i < count; i++) {
    insert.run(`${prefix}${String(i).padStart(4, "0")}`, productId, createdAt, createdAt + 600_000);
  }
}

describe("trial verifications", () => {
  test("a start deletes nothing itself, however many verifications are overdue", async () => {
    const f = await trialFixture(t);
    const now = t.clock.now().getTime();
    insertTrialVerifications(f.productId, "tvr_old", 50, now - 3 * DAY_MS);
    const started = await startTrial(t, f.productId, "ada@example.com", new TestDevice());
    expect(started.status).toBe(202);
    expect(ids("SELECT id FROM trial_verifications WHERE id LIKE 'tvr_old%'")).toHaveLength(50);
  });

  test("the purge deletes exactly the verifications older than two days, a batch per turn of the event loop", async () => {
    const f = await trialFixture(t);
    const now = t.clock.now().getTime();
    insertTrialVerifications(f.productId, "tvr_old", 23, now - 2 * DAY_MS - 1);
    insertTrialVerifications(f.productId, "tvr_new", 5, now - 2 * DAY_MS + 60_000);
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    const pass = services.trials.purgeVerifications(10);
    // The first batch runs at once; the next waits for a turn of the loop.
    expect(ids("SELECT id FROM trial_verifications WHERE id LIKE 'tvr_old%'")).toHaveLength(13);
    expect(await pass).toBe(23);
    expect(ids("SELECT id FROM trial_verifications ORDER BY id")).toEqual(
      Array.from({ length: 5 }, (_, i) => `tvr_new${String(i).padStart(4, "0")}`),
    );
  });

  test("the sweeper's verification pass runs it", async () => {
    const f = await trialFixture(t);
    const now = t.clock.now().getTime();
    insertTrialVerifications(f.productId, "tvr_old", 3, now - 3 * DAY_MS);
    const services = createServices(t.deps, { baseUrl: BASE_URL });
    const done = await sweepVerifications(services, silentLogger);
    expect(done.trial_verifications).toBe(3);
    expect(ids("SELECT id FROM trial_verifications")).toEqual([]);
  });
});

describe("mail outbox", () => {
  const transport: MailTransport = {
    send: async () => {},
    close: () => {},
  } as unknown as MailTransport;

  test("the purge deletes exactly the finished rows past the retention, one window of the key per turn", async () => {
    const now = t.clock.now().getTime();
    const old = now - MAIL_RETENTION_SEC * 1000 - 1;
    const recent = now - MAIL_RETENTION_SEC * 1000 + 60_000;
    const insert = t.deps.sqlite.prepare(
      `INSERT INTO mail_outbox (id, template, locale, recipient, payload, status, attempts, next_attempt_at,
         last_error, created_at, sent_at)
       VALUES (?, 'trial_verification_code', 'en', 'ada@example.com', NULL, ?, 0, ?, NULL, ?, NULL)`,
    );
    const kept: string[] = [];
    let n = 0;
    for (const status of ["sent", "failed", "suppressed", "pending"]) {
      for (const createdAt of [old, recent]) {
        for (let i = 0; i < 4; i++) {
          const id = `mail_${String(++n).padStart(4, "0")}`;
          insert.run(id, status, createdAt, createdAt);
          if (status === "pending" || createdAt === recent) kept.push(id);
        }
      }
    }
    const worker = new MailWorker(t.deps, transport, { from: "a@example.com", logger: silentLogger });
    const pass = worker.purge(8);
    // The first window (the first 8 ids: 4 old and 4 recent sent rows) is done at once, nothing past it.
    expect(ids("SELECT id FROM mail_outbox ORDER BY id")).toHaveLength(32 - 4);
    expect(await pass).toBe(12);
    expect(ids("SELECT id FROM mail_outbox ORDER BY id")).toEqual(kept);
  });
});
