import { Database } from "bun:sqlite";
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { freshEmail, startTrial, type TrialFixture, trialFixture } from "../support/trials.ts";

/**
 * Rule 9's "same 202, same time" as work rather than as a timing (the timing is measured by
 * `test/bench/verification-timing.ts`, which found a silent start for a product without a trial
 * policy 0.24 ms, and one inside the send gap 0.1 ms, cheaper than a sending one): every start runs
 * the same statements and the same encryption; a sending one's outbox row is pending, a silent
 * one's suppressed.
 */
type Method = (...args: unknown[]) => unknown;
const proto = Database.prototype as unknown as Record<"prepare" | "query", Method>;
const originals = { prepare: proto.prepare, query: proto.query };
/**
 * The SQL of every statement run while `tracing` and the shape of what it gave back (whether a row
 * came, with how many columns; how many rows; not the values, which differ by design): a row found
 * for one class and missing for another costs more to materialise, which the timing bench saw as
 * 0.02-0.04 ms for a product without a trial policy when its settings and policy were read apart.
 */
const trace: string[] = [];
let tracing = false;

function shape(run: string, result: unknown): string {
  if (run === "get") return result ? ` -> row of ${Object.keys(result).length}` : " -> none";
  if (run === "all" || run === "values") return ` -> ${(result as unknown[]).length} rows`;
  return "";
}

let t: TestContext;
let fx: TrialFixture;
let withoutPolicy: string;
let encryptions = 0;
const device = new TestDevice();

beforeAll(async () => {
  // Statements are wrapped where they are made, so the ones prepared once at start-up (the send
  // limits) are seen too; the prototype is restored afterwards for the other test files.
  for (const name of ["prepare", "query"] as const) {
    const original = originals[name];
    proto[name] = function (this: Database, sql: unknown, ...rest: unknown[]) {
      const statement = original.call(this, sql, ...rest) as Record<string, Method>;
      for (const run of ["run", "get", "all", "values"]) {
        const method = statement[run];
        if (typeof method !== "function") continue;
        statement[run] = (...args: unknown[]) => {
          const result = method.apply(statement, args);
          if (tracing) trace.push(`${String(sql).replace(/\s+/g, " ")}${shape(run, result)}`);
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
  fx = await trialFixture(t);
  const product = await t.call("POST", "/mgmt/v1/products", {
    body: { name: "No trials", code: `none-${Date.now().toString(36)}`, environment: "live" },
    headers: t.idem(),
  });
  withoutPolicy = product.body.data.public_id;
  // First starts make each product's signing key ready and fill caches: not what is compared.
  await startTrial(t, fx.productId, freshEmail("warm"), device);
  await startTrial(t, withoutPolicy, freshEmail("warm"), device);
});

afterAll(() => {
  Object.assign(proto, originals);
  t.close();
});

/** The statements and encryptions of one start, which must answer 202. */
async function work(productId: string, email: string) {
  trace.length = 0;
  encryptions = 0;
  tracing = true;
  const response = await startTrial(t, productId, email, device);
  tracing = false;
  expect(response.status).toBe(202);
  return { statements: [...trace], encryptions };
}

/** Outbox rows that will be sent (a silent start's row is suppressed). */
const mailRows = () =>
  t.deps.sqlite
    .query<{ n: number }, []>("SELECT count(*) AS n FROM mail_outbox WHERE status != 'suppressed'")
    .get()?.n ?? 0;
const outboxInserts = (statements: string[]) =>
  statements.filter((sql) => sql.startsWith('insert into "mail_outbox"')).length;

describe("a trial start does the same work whether or not it sends", () => {
  test("a start inside the 120 s gap runs the same statements as the sending one before it and mails nothing", async () => {
    const email = freshEmail("gap");
    const before = mailRows();
    const sending = await work(fx.productId, email);
    const silent = await work(fx.productId, email);
    expect(mailRows()).toBe(before + 1);
    expect(outboxInserts(sending.statements)).toBe(1);
    expect(silent.statements).toEqual(sending.statements);
    expect(silent.encryptions).toBe(sending.encryptions);
    expect(silent.encryptions).toBeGreaterThan(0);
    const rows = t.deps.sqlite
      .query<{ status: string; payload: string | null }, [string]>(
        "SELECT status, payload FROM mail_outbox WHERE recipient = ? ORDER BY id",
      )
      .all(email);
    expect(rows.map((row) => row.status)).toEqual(["pending", "suppressed"]);
    // The suppressed row is as large as the sent one (its payload encrypted too); nothing sends it.
    expect(rows[1]?.payload).toStartWith("v1.");
    expect(rows[1]?.payload?.length).toBe(rows[0]?.payload?.length);
  });

  test("a start for a product without a trial policy runs the same statements as one refused by the send limits", async () => {
    const email = freshEmail("gap");
    const sending = await work(fx.productId, email);
    const gap = await work(fx.productId, email);
    const before = mailRows();
    const disabled = await work(withoutPolicy, freshEmail("none"));
    expect(mailRows()).toBe(before);
    expect(disabled.statements).toEqual(gap.statements);
    expect(disabled.statements).toEqual(sending.statements);
    expect(disabled.encryptions).toBe(sending.encryptions);
  });

  test("a start while the plan lacks trial_licenses runs the same statements as a sending one and mails nothing", async () => {
    const sending = await work(fx.productId, freshEmail("entitled"));
    t.workspace.setPlan("personal");
    try {
      // The first request after a plan change reads the new plan once: not part of a start.
      await startTrial(t, fx.productId, freshEmail("warm"), device);
      const before = mailRows();
      const refused = await work(fx.productId, freshEmail("unentitled"));
      expect(mailRows()).toBe(before);
      expect(refused.statements).toEqual(sending.statements);
      expect(refused.encryptions).toBe(sending.encryptions);
    } finally {
      t.workspace.setPlan("self_hosted");
    }
  });
});
