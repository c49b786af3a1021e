import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Elysia } from "elysia";
import Stripe from "stripe";
import { createApp } from "../../src/app.ts";
import { resolveConfig } from "../../src/config.ts";
import { scopeRegistry } from "../../src/http/auth.ts";
import { jsonLogger } from "../../src/http/logger.ts";
import { BillingService } from "../../src/modules/billing/service.ts";
import { type RunningServer, startServer } from "../../src/server.ts";
import { TestDevice } from "../support/device.ts";
import { BASE_URL, createTestContext, type TestContext } from "../support/harness.ts";
import { confirmVerification, namedUserFixture, startVerification } from "../support/named-users.ts";
import { runtimeFixture } from "../support/runtime.ts";
import { storeDigest } from "../support/store-digest.ts";
import { MANAGEMENT_ROUTES, seedResources } from "./route-table.ts";

/**
 * The security review of issue 8, as tests: what must never be logged, what must never be stored
 * in the clear, what a test key must never see or change, and that every management route states
 * the scope it needs. (Scopes per route, 401s and cross-environment 404s are in security.test.ts.)
 */
let t: TestContext;
beforeAll(() => {
  t = createTestContext();
});
afterAll(() => t.close());

/** Every spelling in which a secret could leak: as issued, without dashes, lowercased, just its random part. */
function spellings(secret: string): string[] {
  const forms = new Set([secret, secret.replaceAll("-", ""), secret.toLowerCase()]);
  const random = /^lsk_(live|test)_(.+)$/.exec(secret)?.[2];
  if (random) forms.add(random);
  return [...forms];
}

describe("logs", () => {
  test("API keys and license keys never reach the log, wherever a client puts them", async () => {
    const lines: string[] = [];
    const config = { ...resolveConfig({ "data-dir": t.dir }, {}, t.dir), port: 0 };
    const server: RunningServer = startServer({
      config,
      passphrase: "test passphrase",
      logger: jsonLogger("debug", (line) => lines.push(line) > 0),
    });
    try {
      const live = t.keys.live;
      const madeUp = `lsk_live_${"Q".repeat(32)}`;
      const send = (path: string, init: RequestInit = {}) => fetch(`${server.url}${path}`, init);
      const auth = (key: string) => ({ authorization: `Bearer ${key}` });
      const created = await (
        await send("/mgmt/v1/products", {
          method: "POST",
          headers: {
            ...auth(live),
            "content-type": "application/json",
            "idempotency-key": "log-test-product-01",
          },
          body: JSON.stringify({ name: "Logged", code: "logged", environment: "live" }),
        })
      ).json();
      const productId = created.data.public_id;
      const policy = await (
        await send("/mgmt/v1/policies", {
          method: "POST",
          headers: {
            ...auth(live),
            "content-type": "application/json",
            "idempotency-key": "log-test-policy-01",
          },
          body: JSON.stringify({ product_id: productId, name: "P" }),
        })
      ).json();
      const license = await (
        await send("/mgmt/v1/licenses", {
          method: "POST",
          headers: {
            ...auth(live),
            "content-type": "application/json",
            "idempotency-key": "log-test-license-1",
          },
          body: JSON.stringify({ product_id: productId, policy_id: policy.data.public_id }),
        })
      ).json();
      const licenseKey: string = license.data.key;
      await send(`/mgmt/v1/licenses/${license.data.public_id}`, { headers: auth(live) });
      // The key in every place a careless client might put it.
      await send("/mgmt/v1/products", { headers: auth(madeUp) });
      await send(`/mgmt/v1/products?api_key=${live}&cursor=${licenseKey}`, { headers: auth(live) });
      await send(`/mgmt/v1/products/${live}`, { headers: auth(live) });
      await send(`/mgmt/v1/licenses/${licenseKey}`, { headers: auth(live) });
      await send("/mgmt/v1/products", { headers: { "x-api-key": live, authorization: `Basic ${live}` } });
      await send("/mgmt/v1/customers", {
        method: "POST",
        headers: {
          ...auth(live),
          "content-type": "application/json",
          "idempotency-key": "log-test-customer-1",
        },
        body: JSON.stringify({ name: live, notes: licenseKey, unknown: live }),
      });
      await send("/runtime/v1/activations", {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": "log-test-activation" },
        body: JSON.stringify(
          new TestDevice().activationBody({
            licenseKey,
            productId,
            clientTime: Math.floor(Date.now() / 1000),
          }),
        ),
      });
      await send("/runtime/v1/activations", {
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": "log-test-activation-2" },
        body: `{"license_key":"${licenseKey}",`,
      });
      await server.shutdown("test");
      const log = lines.join("");
      // The capture works: every request above left its line.
      expect(lines.filter((line) => JSON.parse(line).msg === "request").length).toBeGreaterThanOrEqual(12);
      for (const secret of [live, madeUp, licenseKey].flatMap(spellings)) expect(log).not.toContain(secret);
    } finally {
      await server.shutdown("test");
    }
  });
});

describe("the database file", () => {
  test("holds no license key, API key or keystore secret in the clear, in the store or its WAL", async () => {
    const keys: string[] = [t.keys.live, t.keys.test];
    for (let i = 0; i < 3; i++) {
      const fixture = await runtimeFixture(t);
      keys.push(fixture.licenseKey);
      // Updates and reads must not leave copies either.
      await t.call("PATCH", `/mgmt/v1/licenses/${fixture.licenseId}`, { body: { metadata: { n: i } } });
      await t.call("GET", `/mgmt/v1/licenses/${fixture.licenseId}`);
    }
    const dataKey = Buffer.from(t.deps.keystore.secret("data-key"));
    const secrets = [
      ...keys.flatMap(spellings),
      "test passphrase",
      dataKey.toString("hex"),
      dataKey.toString("base64url"),
      dataKey.toString("base64"),
    ];
    const files = readdirSync(t.dir).filter((name) => name.startsWith("licensing.db"));
    expect(files).toEqual(expect.arrayContaining(["licensing.db", "licensing.db-wal"]));
    for (const name of files) {
      const bytes = readFileSync(join(t.dir, name));
      for (const secret of secrets)
        expect({ name, found: bytes.includes(secret) }).toEqual({ name, found: false });
      // The data key as raw bytes, too.
      expect(bytes.includes(dataKey)).toBe(false);
    }
  });

  test("holds the billing API key, webhook signing secret and claim tokens only encrypted", async () => {
    const apiKey = `rk_live_${"K".repeat(40)}`;
    const webhookSecret = `whsec_${"S".repeat(40)}`;
    const billing = new BillingService(t.deps, () => t.workspace.plan(), BASE_URL);
    billing.configure(
      { provider: "stripe", apiKey, webhookSecret, secureClaims: true },
      { type: "cli", id: "t" },
    );
    const fixture = await runtimeFixture(t);
    billing.addOffering(
      { priceId: "price_dbgrep", productId: fixture.productId, policyId: fixture.policyId },
      { type: "cli", id: "t" },
    );
    const payload = JSON.stringify({
      id: "evt_dbgrep",
      type: "checkout.session.completed",
      livemode: true,
      data: {
        object: {
          id: "cs_dbgrep",
          mode: "payment",
          payment_status: "paid",
          customer_details: { email: "grep@example.com" },
          metadata: { licensing_price_id: "price_dbgrep" },
        },
      },
    });
    const signature = await new Stripe("sk_test_x").webhooks.generateTestHeaderStringAsync({
      payload,
      secret: webhookSecret,
      timestamp: Math.floor(t.clock.now().getTime() / 1000),
    });
    const delivered = await t.call("POST", "/billing/v1/stripe/webhook", {
      key: null,
      rawBody: payload,
      headers: { "content-type": "application/json", "stripe-signature": signature },
    });
    expect(delivered.body.data.result).toBe("succeeded");
    const mail = t.deps.sqlite
      .query<{ id: string; payload: string }, []>(
        "SELECT id, payload FROM mail_outbox WHERE recipient = 'grep@example.com'",
      )
      .get();
    const claimUrl: string = JSON.parse(
      t.deps.secrets.decrypt(mail?.payload ?? "", `mail_outbox:${mail?.id}`),
    ).claim_url;
    const token = claimUrl.split("#")[1] ?? "";
    expect(token.length).toBeGreaterThan(40);
    const files = readdirSync(t.dir).filter((name) => name.startsWith("licensing.db"));
    for (const name of files) {
      const bytes = readFileSync(join(t.dir, name));
      for (const secret of [apiKey, webhookSecret, webhookSecret.slice(6), token, claimUrl])
        expect({ name, found: bytes.includes(secret) }).toEqual({ name, found: false });
    }
  });

  test("the keystore file holds its secrets only sealed", () => {
    const text = readFileSync(join(t.dir, "keystore.json"));
    for (const entry of t.deps.keystore.entries()) {
      const secret = Buffer.from(t.deps.keystore.secret(entry.id));
      for (const form of [
        secret,
        secret.toString("hex"),
        secret.toString("base64url"),
        secret.toString("base64"),
      ]) {
        expect({ entry: entry.id, found: text.includes(form) }).toEqual({ entry: entry.id, found: false });
      }
    }
  });
});

describe("a test key and live data", () => {
  test("no list a test key can read shows a live-only resource", async () => {
    const ids = seedResources(t);
    // Shared by both environments by design (docs/api.md): customers and resellers.
    const liveOnly = [
      ids.live.product,
      ids.live.policy,
      ids.live.license,
      ids.live.activation,
      ids.live.block,
    ];
    const fixture = await runtimeFixture(t);
    liveOnly.push(fixture.productId, fixture.licenseId);
    // A refused live activation leaves a runtime event; creating the fixture left audit events.
    await t.call("POST", "/runtime/v1/activations", {
      key: null,
      body: new TestDevice().activationBody({
        licenseKey: "AAAAA-AAAAA-AAAAA-AAAAA-AAAAA",
        productId: fixture.productId,
        clientTime: Math.floor(t.clock.now().getTime() / 1000),
      }),
      headers: t.idem(),
    });
    const lists = MANAGEMENT_ROUTES.filter((route) => route.method === "GET" && !route.path.includes(":"));
    expect(lists.length).toBeGreaterThan(5);
    for (const route of lists) {
      const asTest = await t.call("GET", route.path, { key: t.keys.test });
      expect({ route: route.path, status: asTest.status }).toEqual({ route: route.path, status: 200 });
      for (const id of liveOnly)
        expect({ route: route.path, leaks: asTest.text.includes(id) }).toEqual({
          route: route.path,
          leaks: false,
        });
    }
    // And the live key does see them, so the check above can fail.
    expect((await t.call("GET", "/mgmt/v1/licenses?limit=200")).text).toContain(fixture.licenseId);
    expect((await t.call("GET", "/mgmt/v1/events?limit=200")).text).toContain(fixture.productId);
    expect((await t.call("GET", "/mgmt/v1/runtime_events?limit=200")).text).toContain(fixture.productId);
  });

  test("no create with a test key can reference or make live resources", async () => {
    const ids = seedResources(t);
    const creates = MANAGEMENT_ROUTES.filter((route) => route.method === "POST" && route.body);
    let checked = 0;
    for (const route of creates) {
      const body = route.body?.(ids.live) ?? {};
      const text = JSON.stringify(body);
      if (!Object.values(ids.live).some((id) => text.includes(id)) && !text.includes('"live"')) continue;
      checked++;
      const path = route.resource ? route.path.replace(":id", ids.live[route.resource]) : route.path;
      const before = storeDigest(t.deps.sqlite);
      const response = await t.call("POST", path, { key: t.keys.test, body, headers: t.idem() });
      expect({ route: route.path, refused: response.status >= 400 && response.status < 500 }).toEqual({
        route: route.path,
        refused: true,
      });
      expect(storeDigest(t.deps.sqlite)).toBe(before);
    }
    expect(checked).toBeGreaterThan(3);
  });
});

/** The management routes of an app that no `scope` macro guards. */
const unscopedManagementRoutes = (app: { routes: { method: string; path: string; hooks: unknown }[] }) => {
  const scopeOf = scopeRegistry(app.routes);
  return app.routes
    .filter((route) => route.path.startsWith("/mgmt/") && !scopeOf(route.method, route.path))
    .map((route) => `${route.method} ${route.path}`);
};

describe("scopes", () => {
  test("every management route the app serves declares the scope it needs", () => {
    expect(unscopedManagementRoutes(t.app)).toEqual([]);
  });

  test("a management route added without a scope is caught", () => {
    const app = createApp(t.deps, { baseUrl: BASE_URL }).use(
      new Elysia().get("/mgmt/v1/forgotten", () => ({ data: "anyone with any key" })),
    );
    expect(unscopedManagementRoutes(app)).toEqual(["GET /mgmt/v1/forgotten"]);
  });
});

describe("SQL", () => {
  /** Built with interpolation on purpose, each for a reason stated beside it in the source. */
  const ALLOWED = new Set([
    "src/store/backup.ts",
    "src/store/data-key.ts",
    "src/store/prepared-insert.ts",
    "src/store/prepared-select.ts",
  ]);

  test("is built only from constant text and parameters outside the files that state why", () => {
    const root = join(import.meta.dir, "../..");
    const offenders: string[] = [];
    const walk = (dir: string) => {
      for (const entry of readdirSync(join(root, dir), { withFileTypes: true })) {
        const path = `${dir}/${entry.name}`;
        if (entry.isDirectory()) walk(path);
        else if (path.endsWith(".ts") && !ALLOWED.has(path)) {
          const source = readFileSync(join(root, path), "utf8");
          // A template literal with a substitution that reads like SQL, and is not drizzle's `sql` tag
          // (which turns substitutions into parameters).
          for (const match of source.matchAll(/(?<![\w.])(sql)?`([^`]*\$\{[^`]*)`/g)) {
            if (match[1] === "sql") continue;
            if (/\b(SELECT|INSERT|UPDATE|DELETE|PRAGMA|VACUUM|CREATE|DROP|ALTER)\b/.test(match[2] ?? "")) {
              offenders.push(`${path}:${source.slice(0, match.index).split("\n").length}`);
            }
          }
        }
      }
    };
    walk("src");
    expect(offenders).toEqual([]);
  });
});

describe("named users and mail", () => {
  test("TOTP secrets, recovery codes and named-user tokens are stored only encrypted or as HMACs", async () => {
    const f = await namedUserFixture(t);
    const enrolment = await t.call("POST", `/mgmt/v1/license-users/${f.userId}/two-factor/totp`);
    const secret: string = enrolment.body.data.secret;
    const recovery: string[] = enrolment.body.data.recovery_codes;
    const device = new TestDevice();
    const started = await startVerification(t, device, f, f.email);
    const mail = t.deps.sqlite
      .query<{ id: string; payload: string }, [string]>(
        "SELECT id, payload FROM mail_outbox WHERE recipient = ? AND status = 'pending'",
      )
      .get(f.email);
    const code: string = JSON.parse(
      t.deps.secrets.decrypt(mail?.payload ?? "", `mail_outbox:${mail?.id}`),
    ).code;
    const confirmed = await confirmVerification(t, device, started.body.data.verification_id, code);
    // Two-factor is only pending (not confirmed), so the confirm needs no second factor.
    const token: string = confirmed.body.data.named_user_token;
    expect(token).toStartWith("nut_");
    const forms = [
      secret,
      secret.toLowerCase(),
      token,
      ...recovery,
      ...recovery.map((r) => r.replace("-", "")),
    ];
    for (const name of readdirSync(t.dir).filter((n) => n.startsWith("licensing.db"))) {
      const bytes = readFileSync(join(t.dir, name));
      for (const form of forms)
        expect({ name, form, found: bytes.includes(form) }).toEqual({ name, form, found: false });
    }
  });

  test("the SMTP password is never logged nor stored, even when sending fails", async () => {
    const password = "Sm7p-Pa55word-Never-Logged";
    const lines: string[] = [];
    const config = {
      ...resolveConfig(
        { "data-dir": t.dir },
        { LICENSING_SMTP_URL: `smtp://mailer:${password}@127.0.0.1:1` },
        t.dir,
      ),
      port: 0,
    };
    const server = startServer({
      config,
      passphrase: "test passphrase",
      logger: jsonLogger("debug", (line) => lines.push(line) > 0),
    });
    try {
      const f = await namedUserFixture(t);
      const response = await fetch(`${server.url}/runtime/v1/email-verifications`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          product_id: f.productId,
          license_key: f.licenseKey,
          email: f.email,
          device_signing_public_key: new TestDevice().signingPublic,
          nonce: "n".repeat(24),
        }),
      });
      expect(response.status).toBe(202);
      const deadline = Date.now() + 5_000;
      while (!lines.some((l) => l.includes("mail send failed")) && Date.now() < deadline) await Bun.sleep(20);
    } finally {
      await server.shutdown("test");
    }
    const log = lines.join("\n");
    expect(log).toContain("mail send failed");
    expect(log).toContain("smtp://mailer:***@127.0.0.1:1");
    expect(log).not.toContain(password);
    for (const name of readdirSync(t.dir).filter((n) => n.startsWith("licensing.db"))) {
      expect(readFileSync(join(t.dir, name)).includes(password)).toBe(false);
    }
  });
});
