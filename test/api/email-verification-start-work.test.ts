import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import {
  type NamedUserFixture,
  namedUserFixture,
  otherLicense,
  seedNamedUser,
  startVerification,
} from "../support/named-users.ts";

/**
 * Rule 6's "same 202" as work, with the send limits in: a start the limits hold back must not be
 * told apart from one that sends (or the limit would tell an attacker the address has a user).
 * Every start runs the same statements, each changing as many rows (a held-back start stamps the
 * open verification instead of replacing it), the same encryptions, and writes the same rows' pages
 * (the WAL tests below). The timing itself is measured by test/bench/verification-timing.ts.
 */
type Method = (...args: unknown[]) => unknown;
const proto = Database.prototype as unknown as Record<"prepare" | "query", Method>;
const originals = { prepare: proto.prepare, query: proto.query };
const trace: string[] = [];
let tracing = false;
let encryptions = 0;

let t: TestContext;
let f: NamedUserFixture;
let counter = 0;

beforeAll(async () => {
  for (const name of ["prepare", "query"] as const) {
    const original = originals[name];
    proto[name] = function (this: Database, sql: unknown, ...rest: unknown[]) {
      const statement = original.call(this, sql, ...rest) as Record<string, Method>;
      for (const run of ["run", "get", "all", "values"]) {
        const method = statement[run];
        if (typeof method !== "function") continue;
        statement[run] = (...args: unknown[]) => {
          const result = method.apply(statement, args);
          if (tracing) {
            const changes = run === "run" ? ` -> ${(result as { changes: number }).changes}` : "";
            trace.push(`${String(sql).replace(/\s+/g, " ")}${changes}`);
          }
          return result;
        };
      }
      return statement;
    };
  }
  t = createTestContext();
  const encrypt = t.deps.secrets.encrypt.bind(t.deps.secrets);
  t.deps.secrets.encrypt = (...args: Parameters<typeof encrypt>) => {
    if (tracing) encryptions++;
    return encrypt(...args);
  };
  f = await namedUserFixture(t);
});

afterAll(() => {
  Object.assign(proto, originals);
  t.close();
});

async function work(email: string) {
  trace.length = 0;
  encryptions = 0;
  tracing = true;
  const response = await startVerification(t, new TestDevice(), f, email);
  tracing = false;
  expect(response.status).toBe(202);
  return { statements: [...trace], encryptions };
}

const sentTo = (email: string) =>
  t.deps.sqlite
    .query<{ n: number }, [string]>(
      "SELECT count(*) AS n FROM mail_outbox WHERE recipient = ? AND status != 'suppressed'",
    )
    .get(email)?.n ?? 0;

describe("an email verification start does the same work whether it sends, is held back, or matches nobody", () => {
  test("a start held back by the send limit runs the same statements, changing as many rows, as a sending one", async () => {
    // Each class with an open verification first, as after any earlier start.
    await startVerification(t, new TestDevice(), f, f.email);
    const nobody = `nobody-${++counter}@example.com`;
    await startVerification(t, new TestDevice(), f, nobody);
    t.clock.advance(121);
    const before = sentTo(f.email);
    const sending = await work(f.email);
    expect(sentTo(f.email)).toBe(before + 1);
    const held = await work(f.email);
    expect(sentTo(f.email)).toBe(before + 1);
    const unknown = await work(nobody);
    expect(held.statements).toEqual(sending.statements);
    expect(unknown.statements).toEqual(sending.statements);
    // The open verification a held-back start writes is looked up by a statement of its own that
    // every start runs: inside the UPDATE, SQLite skipped it for the starts that may send.
    expect(
      sending.statements.filter((sql) =>
        /^select "id" from "email_verifications" where .*order by "email_verifications"."counted"/i.test(sql),
      ),
    ).toHaveLength(1);
    expect(held.encryptions).toBe(sending.encryptions);
    expect(unknown.encryptions).toBe(sending.encryptions);
    expect(
      sending.statements.some(
        (sql) => sql.startsWith('update "email_verifications"') && sql.endsWith("-> 1"),
      ),
    ).toBe(true);
  });

  test("a start the mailbox holds back (its user was just mailed through another license) runs the same statements as a sending one", async () => {
    const { userId } = seedNamedUser(t, "live", f.licenseId);
    const email = `${userId.toLowerCase()}@example.com`;
    const other = await otherLicense(t, f, userId);
    await startVerification(t, new TestDevice(), f, email);
    t.clock.advance(121);
    const sending = await work(email);
    expect(sentTo(email)).toBe(2);
    t.clock.advance(121);
    expect((await startVerification(t, new TestDevice(), other, email)).status).toBe(202);
    expect(sentTo(email)).toBe(3);
    const mailboxHeld = await work(email);
    expect(sentTo(email)).toBe(3);
    expect(mailboxHeld.statements).toEqual(sending.statements);
    expect(mailboxHeld.encryptions).toBe(sending.encryptions);
  });

  test("the held-back start leaves the open verification open", async () => {
    t.clock.advance(121);
    const open = await startVerification(t, new TestDevice(), f, f.email);
    await startVerification(t, new TestDevice(), f, f.email);
    const row = t.deps.sqlite
      .query<{ closed_at: number | null }, [string]>("SELECT closed_at FROM email_verifications WHERE id = ?")
      .get(open.body.data.verification_id);
    expect(row?.closed_at).toBeNull();
  });
});

/**
 * The pages of `table` that the WAL holds since the last checkpoint and that contain `text`: which
 * of its rows a statement really wrote. SQLite compares a rewritten row with the stored one and
 * leaves the page alone when nothing changed, so "the statement ran and matched a row" does not
 * mean "the row's page was written".
 */
function walPagesOf(table: string, text: string): number[] {
  const wal = readFileSync(`${t.deps.sqlite.filename}-wal`);
  const pageSize = wal.readUInt32BE(8);
  const salt = wal.readUInt32BE(16);
  const tablePages = new Set(
    t.deps.sqlite
      .query<{ pageno: number }, [string]>("SELECT pageno FROM dbstat WHERE name = ?")
      .all(table)
      .map((row) => row.pageno),
  );
  const needle = Buffer.from(text);
  const found = new Set<number>();
  for (let frame = 32; frame + 24 + pageSize <= wal.length; frame += 24 + pageSize) {
    if (wal.readUInt32BE(frame + 8) !== salt) break;
    const page = wal.readUInt32BE(frame);
    const content = wal.subarray(frame + 24, frame + 24 + pageSize);
    if (tablePages.has(page) && content.includes(needle)) found.add(page);
  }
  return [...found];
}

/** Starts for other addresses, so that an earlier verification's row is no longer on the table's last page. */
async function moreVerifications(count: number) {
  for (let i = 0; i < count; i++)
    await startVerification(t, new TestDevice(), f, `filler-${++counter}@example.com`);
}

/** The pages `start` writes of the open verification it meets, counted in the WAL alone. */
async function pagesWrittenOfOpen(email: string, openId: string) {
  // Everything before is in the database file: the WAL then holds this start's frames alone.
  const checkpoint = t.deps.sqlite
    .query<{ busy: number; log: number }, []>("PRAGMA wal_checkpoint(TRUNCATE)")
    .get();
  expect(checkpoint).toMatchObject({ busy: 0, log: 0 });
  t.deps.sqlite.run("PRAGMA wal_autocheckpoint = 0");
  try {
    const response = await startVerification(t, new TestDevice(), f, email);
    expect(response.status).toBe(202);
    return walPagesOf("email_verifications", openId);
  } finally {
    t.deps.sqlite.run("PRAGMA wal_autocheckpoint = 1000");
  }
}

describe("an email verification start writes the open verification it meets, whether or not it sends", () => {
  test("a start held back by the send limit writes the open verification's page, as one that replaces it does", async () => {
    t.clock.advance(121);
    const sentBefore = sentTo(f.email);
    const open = await startVerification(t, new TestDevice(), f, f.email);
    expect(sentTo(f.email)).toBe(sentBefore + 1);
    await moreVerifications(60);
    // Inside the 120 s gap: held back, the open verification stays open...
    expect(await pagesWrittenOfOpen(f.email, open.body.data.verification_id)).not.toHaveLength(0);
    expect(sentTo(f.email)).toBe(sentBefore + 1);
    const row = t.deps.sqlite
      .query<{ closed_at: number | null; created_at: number; latest_start_at: number | null }, [string]>(
        "SELECT closed_at, created_at, latest_start_at FROM email_verifications WHERE id = ?",
      )
      .get(open.body.data.verification_id);
    // ...and is stamped with the start that met it, which is what makes SQLite write it.
    expect(row?.closed_at).toBeNull();
    expect(row?.latest_start_at).toBeGreaterThan(row?.created_at ?? Number.POSITIVE_INFINITY);

    // The comparison: past the gap the next start sends and replaces the open verification.
    t.clock.advance(121);
    await moreVerifications(60);
    expect(await pagesWrittenOfOpen(f.email, open.body.data.verification_id)).not.toHaveLength(0);
    expect(sentTo(f.email)).toBe(sentBefore + 2);
  });

  test("a start for an address that matches nobody writes the open verification's page too", async () => {
    const nobody = `nobody-${++counter}@example.com`;
    const open = await startVerification(t, new TestDevice(), f, nobody);
    await moreVerifications(60);
    expect(await pagesWrittenOfOpen(nobody, open.body.data.verification_id)).not.toHaveLength(0);
  });

  test("repeated held-back starts keep the counted verification open and close the uncounted one before them, one row each", async () => {
    // A user of its own: the earlier tests spent most of f.email's hourly sends.
    const { userId } = seedNamedUser(t, "live", f.licenseId);
    const email = `${userId.toLowerCase()}@example.com`;
    const sent = await startVerification(t, new TestDevice(), f, email);
    expect(sentTo(email)).toBe(1);
    const held: string[] = [];
    for (let i = 0; i < 4; i++) {
      const { statements } = await work(email);
      // One open verification written per start, however many held-back starts came before:
      // the counted (sent) one the first time, then each time the uncounted one the last start left.
      expect(statements.filter((sql) => sql.startsWith('update "email_verifications"'))).toEqual([
        expect.stringMatching(/-> 1$/),
      ]);
      held.push(
        t.deps.sqlite
          .query<{ id: string }, []>("SELECT id FROM email_verifications ORDER BY rowid DESC LIMIT 1")
          .get()?.id as string,
      );
    }
    expect(sentTo(email)).toBe(1);
    const state = (id: string) =>
      t.deps.sqlite
        .query<{ closed_reason: string | null; latest_start_at: number | null }, [string]>(
          "SELECT closed_reason, latest_start_at FROM email_verifications WHERE id = ?",
        )
        .get(id);
    // The user's code still works: the sent verification stays open.
    expect(state(sent.body.data.verification_id)).toMatchObject({ closed_reason: null });
    expect(state(sent.body.data.verification_id)?.latest_start_at).not.toBeNull();
    for (const id of held.slice(0, -1)) expect(state(id)).toMatchObject({ closed_reason: "replaced" });
    expect(state(held.at(-1) as string)).toMatchObject({ closed_reason: null });
  });
});
