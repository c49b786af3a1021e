import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import type { Deps } from "../../src/deps.ts";
import { AdjustableClock } from "../../src/domain/clock.ts";
import { IdGenerator } from "../../src/domain/ids.ts";
import { BillingService } from "../../src/modules/billing/service.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { concretePath, type Ids, MANAGEMENT_ROUTES, seedResources } from "../api/route-table.ts";
import { TestDevice } from "../support/device.ts";
import {
  changesSince,
  columnsOf,
  fillStore,
  type Row,
  readAllRows,
  removeGenericRows,
  snapshot,
  tablesOf,
  triggerKeptTables,
} from "../support/every-schema.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { enableTotp, namedUserFixture, startVerification } from "../support/named-users.ts";
import { activatedDevice, runtimeFixture } from "../support/runtime.ts";
import { freshEmail, startTrial, trialFixture } from "../support/trials.ts";

/**
 * Migrations are forward-only, so an operator may upgrade from ANY released schema. For every
 * prefix of the journal (a store migrated up to migration k, for each k), rows are written with
 * plain SQL in that schema's columns, then the current migrations run: every row keeps its values
 * in the columns that still exist, the store is consistent, and the app serves reads over it. The
 * list of migrations is the journal's, so a migration added later is tested from every schema
 * before it, and every schema it creates is tested as a starting point, with no edit here.
 * (test/integration/upgrade.test.ts and test/e2e/upgrade.test.ts check the first schema in depth,
 * through the server's start-up and the executable.)
 */
const MIGRATIONS = embeddedMigrations();

/**
 * Columns a migration deliberately rewrites (`table.column` → why). A migration that changes
 * existing values must say so here, or this test fails: that is the point of it.
 */
const REWRITTEN_BY_MIGRATIONS: Record<string, string> = {};
const REWRITTEN = new Set(Object.keys(REWRITTEN_BY_MIGRATIONS));

let t: TestContext;
let exemplar: Map<string, Row[]>;
let ids: Ids;
const dirs: string[] = [];

/** A store at the current schema filled through the app: the source of plausible rows for every schema. */
beforeAll(async () => {
  t = createTestContext();
  ids = seedResources(t).live;
  // Activation counts: a license with two active devices and one deactivated, one with none active.
  const busy = await runtimeFixture(t, { policy: { max_machines: 5 } });
  const devices = [
    await activatedDevice(t, busy),
    await activatedDevice(t, busy),
    await activatedDevice(t, busy),
  ];
  await t.call("DELETE", `/mgmt/v1/activations/${devices[0]?.activationId}`);
  await t.call("PATCH", `/mgmt/v1/products/${busy.productId}/browser-runtime`, {
    body: { enabled: true, allowed_origins: ["https://app.example.com"] },
  });
  // A refused activation leaves a runtime event.
  await t.call("POST", "/runtime/v1/activations", {
    key: null,
    body: new TestDevice().activationBody({
      licenseKey: "AAAAA-AAAAA-AAAAA-AAAAA-AAAAA",
      productId: busy.productId,
      clientTime: Math.floor(t.clock.now().getTime() / 1000),
    }),
    headers: t.idem(),
  });
  const idle = await runtimeFixture(t);
  await t.call("DELETE", `/mgmt/v1/activations/${(await activatedDevice(t, idle)).activationId}`);
  // Named users with two-factor, an email verification, a trial sign-up, billing: their tables get real rows.
  const named = await namedUserFixture(t);
  await enableTotp(t, named.userId);
  await startVerification(t, new TestDevice(), named, named.email);
  const trial = await trialFixture(t);
  await startTrial(t, trial.productId, freshEmail("upgrade"), new TestDevice());
  const billing = new BillingService(t.deps, () => t.workspace.plan(), BASE_URL);
  billing.configure(
    {
      provider: "stripe",
      apiKey: `rk_live_${"K".repeat(40)}`,
      webhookSecret: `whsec_${"S".repeat(40)}`,
      secureClaims: true,
    },
    { type: "cli", id: "upgrade-test" },
  );
  billing.addOffering(
    { priceId: "price_upgrade", productId: busy.productId, policyId: busy.policyId },
    { type: "cli", id: "upgrade-test" },
  );
  exemplar = readAllRows(t.deps.sqlite);
});

afterAll(() => {
  t.close();
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

test("the journal is read in order and every tag is unique, so each schema below is a real step", () => {
  const tags = MIGRATIONS.map((m) => m.tag);
  expect(tags.length).toBeGreaterThanOrEqual(12);
  expect(new Set(tags).size).toBe(tags.length);
  expect([...tags].sort()).toEqual(tags);
  expect(tags[0]).toBe("0000_initial");
});

test("the check catches a migration that loses a row, rewrites a value or drops a table", () => {
  const dir = mkdtempSync(join(tmpdir(), "licensing-every-schema-"));
  dirs.push(dir);
  const store = openStore(join(dir, "licensing.db"));
  try {
    migrate(store.sqlite);
    fillStore(store.sqlite, exemplar);
    const before = snapshot(store.sqlite);
    const careless = (tag: string, statements: string[]) => ({
      tag,
      when: 0,
      hash: tag.padEnd(64, "0"),
      statements,
    });
    migrate(store.sqlite, [
      ...MIGRATIONS,
      careless("9001_rewrite", ["UPDATE customers SET name = upper(name)", "DELETE FROM resellers"]),
      careless("9002_drop", ["DROP TABLE browser_runtime_settings"]),
    ]);
    const changes = changesSince(store.sqlite, before, REWRITTEN).map((change) => change.split(" ")[0]);
    expect(changes).toEqual(["browser_runtime_settings:", "customers", "resellers"]);
  } finally {
    store.close();
  }
});

/** Counted from the activations themselves, whatever kept activation_counts. */
const activationCounts = (sqlite: ReturnType<typeof openStore>["sqlite"]) =>
  sqlite
    .query<{ license_id: string; kept: number; actual: number }, []>(
      `SELECT l.id AS license_id,
              coalesce((SELECT c.active FROM activation_counts c WHERE c.license_id = l.id), 0) AS kept,
              (SELECT count(*) FROM activations a WHERE a.license_id = l.id AND a.status = 'active') AS actual
         FROM licenses l ORDER BY l.id`,
    )
    .all();

/** A fresh store (removed after the file) at the schema just before migration `tag`, and where that is in the journal. */
function storeBefore(tag: string) {
  const at = MIGRATIONS.findIndex((m) => m.tag === tag);
  expect(at).toBeGreaterThan(0);
  const dir = mkdtempSync(join(tmpdir(), "licensing-every-schema-"));
  dirs.push(dir);
  const store = openStore(join(dir, "licensing.db"));
  migrate(store.sqlite, MIGRATIONS.slice(0, at));
  return store;
}

test("the activation-count check catches a 0011 without its backfill", () => {
  const store = storeBefore("0011_activation_counts");
  try {
    fillStore(store.sqlite, exemplar);
    const withoutBackfill = MIGRATIONS.map((m) =>
      m.tag === "0011_activation_counts"
        ? { ...m, statements: m.statements.filter((sql) => !sql.startsWith("INSERT")) }
        : m,
    );
    migrate(store.sqlite, withoutBackfill);
    expect(activationCounts(store.sqlite).filter((row) => row.kept !== row.actual).length).toBeGreaterThan(0);
  } finally {
    store.close();
  }
});

test("0040 starts each subscription at its license's expiry at the upgrade: none for a license that never expires or none made yet", () => {
  // Migration 0040 keeps each subscription's starting expiry, which its license carried alone
  // before: the license's expiry at the upgrade is the best record there is.
  const store = storeBefore("0040_billing_subscription_start");
  try {
    const sqlite = store.sqlite;
    // Only the columns these rows need: the product and policy they name are not the point here.
    sqlite.run("PRAGMA foreign_keys = OFF");
    const license = sqlite.prepare<unknown, [string, number | null]>(
      `INSERT INTO licenses (id, environment, product_id, policy_id, key_ciphertext, key_lookup, license_type,
         status, renewal_authority, entitlements, metadata, version, created_at, updated_at, expires_at)
       VALUES (?1, 'live', 'prod_x', 'pol_x', 'c', ?1, 'subscription', 'active', 'external_billing', '{}', '{}', 1, 0, 0, ?2)`,
    );
    const subscription = sqlite.prepare<unknown, [string, string | null]>(
      `INSERT INTO billing_subscriptions (environment, subscription_id, license_id, paid_through, ends_at, updated_at)
       VALUES ('live', ?, ?, NULL, NULL, 0)`,
    );
    const expiry = Date.UTC(2027, 5, 1);
    license.run("lic_expiring", expiry);
    license.run("lic_perpetual", null);
    subscription.run("sub_expiring", "lic_expiring");
    subscription.run("sub_perpetual", "lic_perpetual");
    subscription.run("sub_awaiting_checkout", null);
    sqlite.run("PRAGMA foreign_keys = ON");

    migrate(sqlite);
    const starts = sqlite
      .query<{ subscription_id: string; starting_end: number | null }, []>(
        "SELECT subscription_id, starting_end FROM billing_subscriptions ORDER BY subscription_id",
      )
      .all();
    expect(starts).toEqual([
      { subscription_id: "sub_awaiting_checkout", starting_end: null },
      { subscription_id: "sub_expiring", starting_end: expiry },
      { subscription_id: "sub_perpetual", starting_end: null },
    ]);
  } finally {
    store.close();
  }
});

describe("upgrading from every previous schema", () => {
  for (const [k, last] of MIGRATIONS.entries()) {
    test(`a store at ${last.tag} keeps every row, stays consistent and is served after the upgrade`, async () => {
      const dir = mkdtempSync(join(tmpdir(), "licensing-every-schema-"));
      dirs.push(dir);
      const store = openStore(join(dir, "licensing.db"));
      try {
        migrate(store.sqlite, MIGRATIONS.slice(0, k + 1));
        const { written, generic } = fillStore(store.sqlite, exemplar);
        // Every table of this schema holds rows (trigger-kept ones through their triggers).
        const kept = triggerKeptTables(store.sqlite);
        for (const table of tablesOf(store.sqlite)) {
          const count = store.sqlite
            .query<{ n: number }, []>(`SELECT count(*) AS n FROM "${table}"`)
            .get()?.n;
          expect({ table, filled: (count ?? 0) > 0 }).toEqual({ table, filled: true });
          if (!kept.has(table)) expect(written.get(table)).toBeGreaterThan(0);
        }
        // The rows are a valid store of their schema, so what follows tests the migrations only.
        expect(store.sqlite.query("PRAGMA foreign_key_check").all()).toEqual([]);
        const before = snapshot(store.sqlite);
        // The ids of the rows this schema had: a resource read must find exactly these.
        const stored = new Set(
          tablesOf(store.sqlite).flatMap((table) =>
            columnsOf(store.sqlite, table).some((c) => c.name === "id" && c.pk > 0)
              ? store.sqlite
                  .query<{ id: string }, []>(`SELECT id FROM "${table}"`)
                  .all()
                  .map((row) => row.id)
              : [],
          ),
        );
        const hadActivations = before.has("activations");

        const result = migrate(store.sqlite);
        expect(result.applied).toEqual(MIGRATIONS.slice(k + 1).map((m) => m.tag));
        expect(result.current).toBe(MIGRATIONS.at(-1)?.tag ?? null);

        expect(store.sqlite.query<{ integrity_check: string }, []>("PRAGMA integrity_check").all()).toEqual([
          { integrity_check: "ok" },
        ]);
        expect(store.sqlite.query("PRAGMA foreign_key_check").all()).toEqual([]);
        expect(changesSince(store.sqlite, before, REWRITTEN)).toEqual([]);

        // 0011_activation_counts: backfilled from, then kept with, the activations themselves.
        const counts = activationCounts(store.sqlite);
        for (const row of counts)
          expect({ license: row.license_id, active: row.kept }).toEqual({
            license: row.license_id,
            active: row.actual,
          });
        // Meaningful once the schema had activations: some licenses hold several, some none.
        if (hadActivations) {
          expect(counts.some((row) => row.actual >= 2)).toBe(true);
          expect(counts.some((row) => row.actual === 0)).toBe(true);
        }

        removeGenericRows(store.sqlite, generic);
        await expectServed(store, stored);
      } finally {
        store.close();
      }
    });
  }
});

/**
 * The app over the upgraded store, with the exemplar's keystore (its ciphertexts and the API key
 * rows came from there): every management GET answers, lists with 200, a resource with 200 when
 * its row was in the old store and 404 when its table did not exist yet; none with a 5xx.
 */
async function expectServed(store: ReturnType<typeof openStore>, stored: ReadonlySet<string>): Promise<void> {
  const deps: Deps = {
    db: store.db,
    sqlite: store.sqlite,
    clock: new AdjustableClock(),
    ids: new IdGenerator(),
    secrets: t.deps.secrets,
    keystore: t.deps.keystore,
  };
  const app = createApp(deps, {
    baseUrl: BASE_URL,
    managementRateLimit: { name: "mgmt", limit: 100_000, windowSec: 1 },
    runtimeRateLimits: { ip: null, activation: null, license: null },
  });
  const get = async (path: string, key: string | null = t.keys.live) => {
    const response = await app.handle(
      new Request(`${BASE_URL}${path}`, { headers: key ? { authorization: `Bearer ${key}` } : {} }),
    );
    return { path, status: response.status, text: await response.text() };
  };
  for (const route of MANAGEMENT_ROUTES.filter((r) => r.method === "GET")) {
    const id = route.resource ? ids[route.resource] : undefined;
    const path = id ? concretePath(route, id) : route.path;
    const read = await get(path);
    // A second path parameter (a delivery of a webhook) names nothing that exists: 404, not 5xx.
    const expected = id !== undefined && (!stored.has(id) || path.includes("/:")) ? 404 : 200;
    const error = read.status >= 500 ? read.text : null;
    expect({ path, status: read.status, error }).toEqual({ path, status: expected, error: null });
  }
  const license = await get(`/mgmt/v1/licenses/${ids.license}`);
  expect(JSON.parse(license.text).data.public_id).toBe(ids.license);
  const bundle = await get(`/runtime/v1/products/${ids.product}/trust-bundle`, null);
  expect(bundle.status).toBeLessThan(500);
}
