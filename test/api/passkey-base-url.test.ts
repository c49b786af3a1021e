import { afterEach, describe, expect, test } from "bun:test";
import { resolveConfig } from "../../src/config.ts";
import { jsonLogger } from "../../src/http/logger.ts";
import { passkeyBaseUrlProblem } from "../../src/modules/named-users/passkeys.ts";
import { startServer } from "../../src/server.ts";
import { licenseUsers, passkeys } from "../../src/store/schema/index.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * Passkeys' relying party is the base URL's host. Browsers never accept an IP address as one, and
 * offer WebAuthn only on secure pages (HTTPS, or localhost): a registration link that can never
 * work is refused, and the server says so at start.
 */
let t: TestContext | undefined;
afterEach(() => {
  t?.close();
  t = undefined;
});

describe("which base URLs passkeys can work with", () => {
  test.each([
    ["http://127.0.0.1:8080", "base_url_host_is_ip_address"],
    ["https://192.0.2.10", "base_url_host_is_ip_address"],
    ["http://[::1]:8080", "base_url_host_is_ip_address"],
    ["https://[2001:db8::1]/licensing", "base_url_host_is_ip_address"],
    ["http://licensing.lan:8080", "base_url_not_secure"],
    ["http://localhost:8080", null],
    ["http://app.localhost:8080", null],
    ["https://licensing.example.com", null],
    ["https://licensing.example.com/licensing", null],
  ] as const)("%s: %s", (baseUrl, reason) => {
    expect(passkeyBaseUrlProblem(baseUrl)?.reason ?? null).toBe(reason);
  });

  test("the problem with an IP address says how to fix it", () => {
    const message = passkeyBaseUrlProblem("http://127.0.0.1:8080")?.message ?? "";
    expect(message).toContain("--base-url");
    expect(message).toContain("http://localhost:8080");
  });
});

describe("a registration link on a base URL whose host is an IP address", () => {
  test("is refused with 422 INVALID_TRANSITION saying why and how to set --base-url, and nothing is written", async () => {
    t = createTestContext({ baseUrl: "http://127.0.0.1:8080" });
    const user = await t.call("POST", "/mgmt/v1/license-users", { body: { email: "ada@example.com" } });
    const link = await t.call(
      "POST",
      `/mgmt/v1/license-users/${user.body.data.public_id}/two-factor/passkeys/registration-link`,
    );
    expect([link.status, link.body.error.code]).toEqual([422, "INVALID_TRANSITION"]);
    expect(link.body.error.details).toEqual({
      reason: "base_url_host_is_ip_address",
      base_url: "http://127.0.0.1:8080",
    });
    expect(link.body.error.message).toContain("IP address");
    expect(link.body.error.message).toContain("--base-url");
    const rows = t.deps.sqlite.query("SELECT count(*) AS n FROM passkey_registrations").get() as {
      n: number;
    };
    expect(rows.n).toBe(0);
    const events = (await t.call("GET", "/mgmt/v1/events")).body.data as { type: string }[];
    expect(events.map((e) => e.type)).not.toContain("license_user.passkey_link_created");
  });

  test("an unknown user is still 404 first", async () => {
    t = createTestContext({ baseUrl: "http://127.0.0.1:8080" });
    const link = await t.call(
      "POST",
      "/mgmt/v1/license-users/usr_00000000000000000000000000/two-factor/passkeys/registration-link",
    );
    expect(link.status).toBe(404);
  });
});

describe("the server's start", () => {
  /** The passkey lines a start logs, on a store `prepare` has put things in. */
  const warningsAt = async (
    flags: Record<string, string>,
    prepare: (store: TestContext) => Promise<void> | void = () => {},
  ) => {
    const store = createTestContext();
    const lines: string[] = [];
    try {
      await prepare(store);
      const server = startServer({
        config: { ...resolveConfig({ "data-dir": store.dir, ...flags }, {}, store.dir), port: 0 },
        passphrase: "test passphrase",
        logger: jsonLogger("debug", (line) => lines.push(line) > 0),
      });
      await server.shutdown("test done");
    } finally {
      store.close();
    }
    return lines
      .map((line) => JSON.parse(line) as { level: string; msg: string; reason?: string })
      .filter((entry) => entry.msg === "passkeys cannot work with this base URL");
  };

  /** A product with a policy whose licenses have named users, who may sign in with passkeys. */
  const namedUserPolicy = async (store: TestContext) => {
    const product = await store.call("POST", "/mgmt/v1/products", {
      body: { name: "Seats", code: "seats", environment: "live" },
      headers: store.idem(),
    });
    const policy = await store.call("POST", "/mgmt/v1/policies", {
      body: { product_id: product.body.data.public_id, name: "Named", identity_mode: "named_user" },
      headers: store.idem(),
    });
    expect(policy.status).toBe(201);
  };

  /** A user with a registered passkey, and no named-user policy (it may have been changed since). */
  const registeredPasskey = (store: TestContext) => {
    const now = store.clock.now();
    const userId = store.deps.ids.next("user", now.getTime());
    store.deps.db
      .insert(licenseUsers)
      .values({
        id: userId,
        environment: "live",
        email: "seat@example.com",
        emailNormalized: "seat@example.com",
        status: "active",
        totpStatus: "none",
        createdAt: now,
        updatedAt: now,
      })
      .run();
    store.deps.db
      .insert(passkeys)
      .values({
        id: "pk_1",
        userId,
        credentialId: "Y3JlZGVudGlhbA",
        publicKey: { alg: -8, jwk: { kty: "OKP", crv: "Ed25519", x: "AAAA" } },
        signCount: 0,
        createdAt: now,
      })
      .run();
  };

  test("says it at info, not warn, on the default http://127.0.0.1:PORT while nothing in the store uses passkeys", async () => {
    const said = await warningsAt({});
    expect(said).toHaveLength(1);
    expect(said[0]).toMatchObject({ level: "info", reason: "base_url_host_is_ip_address" });
  });

  test("warns on the default base URL once a named-user policy exists", async () => {
    const said = await warningsAt({}, namedUserPolicy);
    expect(said).toHaveLength(1);
    expect(said[0]).toMatchObject({ level: "warn", reason: "base_url_host_is_ip_address" });
  });

  test("warns on the default base URL when a passkey is registered, whatever the policies say now", async () => {
    const said = await warningsAt({}, registeredPasskey);
    expect(said.map((entry) => [entry.level, entry.reason])).toEqual([
      ["warn", "base_url_host_is_ip_address"],
    ]);
  });

  test("says plain http on a host other than localhost the same way: warn where passkeys are used, else info", async () => {
    const flags = { "base-url": "http://licensing.lan:8080" };
    expect((await warningsAt(flags, namedUserPolicy)).map((entry) => [entry.level, entry.reason])).toEqual([
      ["warn", "base_url_not_secure"],
    ]);
    expect((await warningsAt(flags)).map((entry) => [entry.level, entry.reason])).toEqual([
      ["info", "base_url_not_secure"],
    ]);
  });

  test("says nothing for https or localhost, even where passkeys are used", async () => {
    expect(await warningsAt({ "base-url": "https://licensing.example.com" }, namedUserPolicy)).toEqual([]);
    expect(await warningsAt({ "base-url": "http://localhost:8080" }, registeredPasskey)).toEqual([]);
  });
});
