import { afterEach, describe, expect, test } from "bun:test";
import { resolveConfig } from "../../src/config.ts";
import { jsonLogger } from "../../src/http/logger.ts";
import { passkeyBaseUrlProblem } from "../../src/modules/named-users/passkeys.ts";
import { startServer } from "../../src/server.ts";
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
  const warningsAt = async (flags: Record<string, string>) => {
    const store = createTestContext();
    const lines: string[] = [];
    try {
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

  test("warns when the base URL is the default http://127.0.0.1:PORT", async () => {
    const warnings = await warningsAt({});
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatchObject({ level: "warn", reason: "base_url_host_is_ip_address" });
  });

  test("warns when the base URL is plain http on a host other than localhost", async () => {
    const warnings = await warningsAt({ "base-url": "http://licensing.lan:8080" });
    expect(warnings.map((w) => w.reason)).toEqual(["base_url_not_secure"]);
  });

  test("says nothing for https or localhost", async () => {
    expect(await warningsAt({ "base-url": "https://licensing.example.com" })).toEqual([]);
    expect(await warningsAt({ "base-url": "http://localhost:8080" })).toEqual([]);
  });
});
