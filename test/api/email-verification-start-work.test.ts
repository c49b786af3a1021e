import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { type NamedUserFixture, namedUserFixture, startVerification } from "../support/named-users.ts";

/**
 * Rule 6's "same 202" as work, with the send limits in: a start the limits hold back must not be
 * told apart from one that sends (or the limit would tell an attacker the address has a user).
 * Every start runs the same statements, each changing as many rows (a held-back start rewrites
 * the open verification unchanged instead of replacing it), and the same encryptions. The timing
 * itself is measured by test/bench/verification-timing.ts.
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
    expect(held.encryptions).toBe(sending.encryptions);
    expect(unknown.encryptions).toBe(sending.encryptions);
    expect(
      sending.statements.some(
        (sql) => sql.startsWith('update "email_verifications"') && sql.endsWith("-> 1"),
      ),
    ).toBe(true);
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
