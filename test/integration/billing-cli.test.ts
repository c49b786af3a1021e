import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createHmac, randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import { finishInit, initialise } from "../../src/cli/init.ts";
import { resolveConfig } from "../../src/config.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { buildDeps, openKeystore, startServer } from "../../src/server.ts";
import { openStore, type Store } from "../../src/store/db.ts";
import { runInProcess } from "../support/in-process-cli.ts";

/**
 * `licensing billing …` through the real command-line entry point on a real data dir, checked
 * through the Management API of an app over the same store.
 */
const BASE = "http://licensing.test";
const work = mkdtempSync(join(tmpdir(), "billing-cli-"));
const dataDir = join(work, "data");
const API_KEY = `rk_test_${randomBytes(24).toString("hex")}`;
const SECRET = `whsec_${randomBytes(24).toString("base64")}`;
let store: Store;
let app: ReturnType<typeof createApp>;
let keys: { live: string; test: string };
let ids: { product: string; policy: string; liveProduct: string; livePolicy: string };

async function api(method: string, path: string, key = keys.test, body?: unknown) {
  const response = await app.handle(
    new Request(`${BASE}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "idempotency-key": `billing-cli-${Math.random()}`,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    }),
  );
  // biome-ignore lint/suspicious/noExplicitAny: JSON from the API.
  return { status: response.status, body: (await response.json()) as any };
}

/** Runs the command line in this process and captures what it prints. */
const cli = (args: string[]) => runInProcess([...args, "--data-dir", dataDir], work);

function secretFile(name: string, content: string, mode = 0o600): string {
  const path = join(work, name);
  writeFileSync(path, `${content}\n`);
  chmodSync(path, mode);
  return path;
}

beforeAll(async () => {
  const init = initialise(resolveConfig({ "data-dir": dataDir }, {}, work));
  // As `licensing init` does once the keys are shown: the staging folder and the lock go.
  finishInit(init);
  keys = init.apiKeys;
  const passphrase = readFileSync(join(dataDir, "keystore.passphrase"), "utf8").trim();
  store = openStore(join(dataDir, "licensing.db"));
  app = createApp(buildDeps(store, openKeystore(dataDir, passphrase)), { baseUrl: BASE });
  const make = async (environment: "live" | "test") => {
    const key = keys[environment];
    const product = (
      await api("POST", "/mgmt/v1/products", key, { name: "Sold", code: `sold-${environment}`, environment })
    ).body.data;
    const policy = (
      await api("POST", "/mgmt/v1/policies", key, { product_id: product.public_id, name: "Bought" })
    ).body.data;
    return { product: product.public_id as string, policy: policy.public_id as string };
  };
  const test = await make("test");
  const live = await make("live");
  ids = { ...test, liveProduct: live.product, livePolicy: live.policy };
});
afterAll(() => {
  store?.close();
  rmSync(work, { recursive: true, force: true });
});

describe("licensing billing configure", () => {
  test("takes the secrets from files, picks the mode from the key, and never prints or returns them", async () => {
    const run = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      secretFile("api-key", API_KEY),
      "--webhook-secret-file",
      secretFile("webhook-secret", SECRET),
      "--claim-url-base",
      "https://shop.example.com",
      "--base-url",
      BASE,
    ]);
    expect(run).toMatchObject({ code: 0, stderr: "" });
    expect(run.stdout).toContain(`${BASE}/billing/v1/stripe/webhook`);
    expect(run.stdout).toContain("test mode");
    const shown = await cli(["billing", "status", "--json", "--base-url", BASE]);
    expect(JSON.parse(shown.stdout).map((s: { mode: string; status: string }) => [s.mode, s.status])).toEqual(
      [
        ["live", "not_configured"],
        ["test", "active"],
      ],
    );
    expect(shown.stdout).not.toContain(API_KEY);
    const status = await api("GET", "/mgmt/v1/billing-integration");
    expect(status.body.data).toMatchObject({
      registered: true,
      mode: "test",
      status: "active",
      license_claim_url: "https://shop.example.com/billing/v1/claims",
    });
    for (const secret of [API_KEY, SECRET]) {
      expect(run.stdout + run.stderr + JSON.stringify(status.body)).not.toContain(secret);
      expect(readFileSync(join(dataDir, "licensing.db")).includes(secret)).toBe(false);
    }
    const events = await api("GET", "/mgmt/v1/events", keys.test);
    expect(events.body.data[0]).toMatchObject({
      type: "billing_integration.configured",
      actor: { type: "cli" },
    });
  });

  /** The real entry point in a child process, so stdin is a real pipe. */
  const cliWithStdin = async (stdin: Uint8Array) => {
    const child = Bun.spawn(
      [
        process.execPath,
        join(import.meta.dir, "../../src/main.ts"),
        "billing",
        "configure",
        "--provider",
        "stripe",
        "--api-key-file",
        "-",
        "--webhook-secret-file",
        secretFile("webhook-secret-2", SECRET),
        "--data-dir",
        dataDir,
      ],
      { stdin, stdout: "pipe", stderr: "pipe", env: { PATH: Bun.env.PATH } },
    );
    return { code: await child.exited, stderr: await new Response(child.stderr).text() };
  };

  test("reads a secret from stdin when its file is -", async () => {
    expect((await cliWithStdin(new TextEncoder().encode(`${API_KEY}\n`))).code).toBe(0);
    expect((await api("GET", "/mgmt/v1/billing-integration")).body.data.registered).toBe(true);
  });

  test("stdin is read no further than 64 KiB: one byte more is refused and changes nothing", async () => {
    const before = (await api("GET", "/mgmt/v1/events")).body.data.length;
    const run = await cliWithStdin(new TextEncoder().encode(`rk_test_${"k".repeat(64 * 1024 - 7)}`));
    expect(run.code).toBe(1);
    expect(run.stderr).toContain("the API key in - is larger than 64 KiB");
    expect((await api("GET", "/mgmt/v1/events")).body.data.length).toBe(before);
  });

  test("a secret with whitespace inside it, or an empty one, is refused by name", async () => {
    const spaced = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      secretFile("spaced-key", `${API_KEY} ${API_KEY}`),
      "--webhook-secret-file",
      secretFile("webhook-secret-6", SECRET),
    ]);
    expect([spaced.code, spaced.stderr]).toEqual([1, expect.stringContaining("has whitespace in it")]);
    const empty = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      secretFile("api-key-7", API_KEY),
      "--webhook-secret-file",
      secretFile("empty-secret", ""),
    ]);
    expect([empty.code, empty.stderr]).toEqual([1, expect.stringContaining("webhook signing secret in")]);
    expect(empty.stderr).toContain("is empty");
  });

  test("a secret file that never ends (/dev/zero) is refused past 64 KiB instead of read into memory", async () => {
    const before = (await api("GET", "/mgmt/v1/events")).body.data.length;
    const run = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      "/dev/zero",
      "--webhook-secret-file",
      secretFile("webhook-secret-3", SECRET),
    ]);
    expect(run.code).toBe(1);
    expect(run.stderr).toContain("the API key in /dev/zero is larger than 64 KiB");
    expect((await api("GET", "/mgmt/v1/events")).body.data.length).toBe(before);
  });

  test("has no flag that takes a secret on the command line, and does not echo one given", async () => {
    const run = await cli(["billing", "configure", "--provider", "stripe", "--api-key", API_KEY]);
    expect(run.code).toBe(2);
    expect(run.stderr).not.toContain(API_KEY);
  });

  test("refuses a key that names no mode and a secret that is not a signing secret, changing nothing", async () => {
    const before = (await api("GET", "/mgmt/v1/events")).body.data.length;
    const badKey = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      secretFile("bad-key", "pk_test_publishable"),
      "--webhook-secret-file",
      secretFile("webhook-secret-3", SECRET),
    ]);
    expect(badKey.code).toBe(1);
    expect(badKey.stderr).toContain("api_key");
    const badSecret = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      secretFile("api-key-4", API_KEY),
      "--webhook-secret-file",
      secretFile("not-whsec", "secret_without_prefix_0123456789"),
    ]);
    expect(badSecret.code).toBe(1);
    expect(badSecret.stderr).toContain("webhook_secret");
    expect((await api("GET", "/mgmt/v1/events")).body.data.length).toBe(before);
  });

  test("warns when a secret file is readable by other users", async () => {
    const run = await cli([
      "billing",
      "configure",
      "--provider",
      "stripe",
      "--api-key-file",
      secretFile("open-key", API_KEY, 0o644),
      "--webhook-secret-file",
      secretFile("webhook-secret-5", SECRET),
    ]);
    expect(run.code).toBe(0);
    expect(run.stderr).toContain("readable by other users");
  });
});

describe("the service's base URL", () => {
  test("without --base-url the webhook URL shown is the one the last server on this store ran with", async () => {
    const webhookUrl = async (...flags: string[]) =>
      JSON.parse((await cli(["billing", "status", "--json", ...flags])).stdout)[0].webhook_url;
    const passphrase = readFileSync(join(dataDir, "keystore.passphrase"), "utf8").trim();
    const serve = async (baseUrl: string) => {
      const config = resolveConfig({ "data-dir": dataDir, "base-url": baseUrl }, {}, work);
      await startServer({ config: { ...config, port: 0 }, passphrase, logger: silentLogger }).shutdown(
        "test",
      );
    };
    await serve("https://licensing.example.com");
    expect(await webhookUrl()).toBe("https://licensing.example.com/billing/v1/stripe/webhook");
    // The latest server's, and a --base-url given still wins.
    await serve("https://licenses.example.org/service");
    expect(await webhookUrl()).toBe("https://licenses.example.org/service/billing/v1/stripe/webhook");
    expect(await webhookUrl("--base-url", BASE)).toBe(`${BASE}/billing/v1/stripe/webhook`);
  });
});

describe("licensing billing status", () => {
  test("shows the last failed event beside the last event, and how many failures no resend has applied", async () => {
    const body = JSON.stringify({
      id: `evt_cli_${Date.now()}`,
      object: "event",
      created: Math.floor(Date.now() / 1000),
      livemode: false,
      type: "checkout.session.completed",
      data: {
        object: {
          id: "cs_test_cli",
          object: "checkout.session",
          mode: "payment",
          payment_status: "paid",
          metadata: { licensing_price_id: "price_notmapped" },
        },
      },
    });
    const timestamp = Math.floor(Date.now() / 1000);
    const signature = createHmac("sha256", SECRET).update(`${timestamp}.${body}`).digest("hex");
    const delivered = await app.handle(
      new Request(`${BASE}/billing/v1/stripe/webhook`, {
        method: "POST",
        headers: { "content-type": "application/json", "stripe-signature": `t=${timestamp},v1=${signature}` },
        body,
      }),
    );
    expect(((await delivered.json()) as { data: { result: string } }).data.result).toBe("failed");
    const { id } = JSON.parse(body);
    const json = JSON.parse((await cli(["billing", "status", "--json", "--base-url", BASE])).stdout);
    expect(json[1]).toMatchObject({
      mode: "test",
      last_failure: { id, type: "checkout.session.completed", reason: "unknown_price", resolved_at: null },
      unresolved_failures: 1,
    });
    const table = (await cli(["billing", "status", "--base-url", BASE])).stdout;
    expect(table).toContain("LAST FAILURE");
    expect(table).toMatch(/test .*checkout\.session\.completed unknown_price \S+ +1\n/);
  });
});

describe("licensing billing offering", () => {
  test("add, list and remove map a price to a product and policy in the product's environment", async () => {
    const add = await cli([
      "billing",
      "offering",
      "add",
      "--price",
      "price_cli1",
      "--product",
      ids.product,
      "--policy",
      ids.policy,
      "--name",
      "Yearly",
      "--duration-days",
      "365",
      "--json",
    ]);
    expect(add.code).toBe(0);
    const offering = JSON.parse(add.stdout);
    expect(offering).toMatchObject({
      billing_price_id: "price_cli1",
      name: "Yearly",
      license_duration_days: 365,
    });
    const status = await api("GET", "/mgmt/v1/billing-integration");
    expect(status.body.data.offerings).toEqual([offering]);

    const duplicate = await cli([
      "billing",
      "offering",
      "add",
      "--price",
      "price_cli1",
      "--product",
      ids.product,
      "--policy",
      ids.policy,
    ]);
    expect(duplicate.code).toBe(1);
    const list = await cli(["billing", "offering", "list", "--json"]);
    expect(JSON.parse(list.stdout)).toEqual([{ ...offering, environment: "test" }]);

    expect((await cli(["billing", "offering", "remove", "price_cli1"])).code).toBe(0);
    expect((await api("GET", "/mgmt/v1/billing-integration")).body.data.offerings[0].status).toBe("removed");
    expect((await cli(["billing", "offering", "remove", "price_cli1"])).code).toBe(1);
  });

  test("refuses a policy of another product and an unknown product, naming each once", async () => {
    const crossed = await cli([
      "billing",
      "offering",
      "add",
      "--price",
      "price_cli2",
      "--product",
      ids.product,
      "--policy",
      ids.livePolicy,
    ]);
    expect([crossed.code, crossed.stderr]).toEqual([
      1,
      `licensing billing offering: policy ${ids.livePolicy} is not a policy of ${ids.product}\n`,
    ]);
    const unknown = await cli([
      "billing",
      "offering",
      "add",
      "--price",
      "price_cli2",
      "--product",
      "prod_nope",
      "--policy",
      ids.policy,
    ]);
    expect([unknown.code, unknown.stderr]).toEqual([
      1,
      "licensing billing offering: product prod_nope does not exist\n",
    ]);
    expect((await cli(["billing", "offering", "add", "--price", "price_cli2"])).code).toBe(2);
  });
});

describe("mistakes in the flags of billing commands", () => {
  const usageError = (command: string, message: string) => ({
    code: 2,
    stdout: "",
    stderr: `licensing ${command}: ${message}\nRun "licensing ${command} --help" for its options.\n`,
  });
  const add = (...flags: string[]) =>
    cli(["billing", "offering", "add", "--product", ids.product, "--policy", ids.policy, ...flags]);
  const offerings = async () => (await api("GET", "/mgmt/v1/billing-integration")).body.data.offerings.length;

  test("configure refuses a --claim-url-base or --api-base-url that is not an http(s) base URL as a usage error, before reading the secrets", async () => {
    // Secret files that do not exist: the URL is refused before they are read.
    for (const [flag, value, problem] of [
      ["--claim-url-base", "notaurl", "must be an absolute http or https URL"],
      [
        "--claim-url-base",
        "https://shop.example.com/?a=1",
        "must be an http(s) URL without query, fragment or userinfo",
      ],
      [
        "--api-base-url",
        "ftp://stripe.example.com",
        "must be an http(s) URL without query, fragment or userinfo",
      ],
    ] as const) {
      const run = await cli([
        "billing",
        "configure",
        "--provider",
        "stripe",
        "--api-key-file",
        join(work, "no-such-key"),
        "--webhook-secret-file",
        join(work, "no-such-secret"),
        flag,
        value,
      ]);
      expect({ value, ...run }).toEqual({ value, ...usageError("billing configure", `${flag} ${problem}`) });
    }
  });

  test("offering add refuses a name the API refuses (a control character, a line break, over 200 characters) as a usage error, and adds nothing", async () => {
    const before = await offerings();
    for (const name of ["evil\u001b[2J", "two\nlines", "c1\u009b", "a".repeat(201), "a".repeat(10_000)]) {
      // The same rule as every name the Management API takes.
      const viaApi = await api("POST", "/mgmt/v1/products", keys.test, {
        name,
        code: "named",
        environment: "test",
      });
      const run = await add("--price", "price_named", "--name", name);
      expect({ name: name.slice(0, 12), api: viaApi.status, ...run }).toEqual({
        name: name.slice(0, 12),
        api: 422,
        ...usageError(
          "billing offering",
          "--name must be one line of 1 to 200 characters without control characters",
        ),
      });
    }
    expect(await offerings()).toBe(before);
    const longest = await add("--price", "price_named", "--name", "a".repeat(200), "--json");
    expect([longest.code, JSON.parse(longest.stdout).name]).toEqual([0, "a".repeat(200)]);
    expect((await cli(["billing", "offering", "remove", "price_named"])).code).toBe(0);
  });

  test("offering add refuses a --price that is not a price id and a --duration-days below 1 as usage errors, and adds nothing", async () => {
    const before = await offerings();
    expect(await add("--price", "prod_not_a_price")).toEqual(
      usageError("billing offering", "--price must be a price id, price_…"),
    );
    expect(await add("--price", "price_days", "--duration-days", "0")).toEqual(
      usageError("billing offering", "--duration-days must be a whole number of days, at least 1"),
    );
    expect(await offerings()).toBe(before);
  });

  test("offering remove --json prints the removed offering, as add --json prints the added one", async () => {
    const added = JSON.parse((await add("--price", "price_removed", "--json")).stdout);
    const removed = await cli(["billing", "offering", "remove", "price_removed", "--json"]);
    expect([removed.code, removed.stderr]).toEqual([0, ""]);
    expect(JSON.parse(removed.stdout)).toEqual({ ...added, status: "removed" });
  });
});

describe("licensing billing disable", () => {
  test("stops the integration and forgets both secrets", async () => {
    const run = await cli(["billing", "disable"]);
    expect(run).toMatchObject({ code: 0 });
    expect(run.stdout).toContain("test");
    const status = await api("GET", "/mgmt/v1/billing-integration");
    expect(status.body.data).toMatchObject({
      registered: false,
      status: "disabled",
      license_claim_url: null,
    });
    const row = store.sqlite
      .query<{ k: string | null; s: string | null }, []>(
        "SELECT api_key_ciphertext AS k, webhook_secret_ciphertext AS s FROM billing_integrations WHERE environment = 'test'",
      )
      .get();
    expect(row).toEqual({ k: null, s: null });
    expect((await cli(["billing", "disable"])).stdout).toContain("No active billing integration");
  });
});

describe("the plan", () => {
  test("without billing_integration configuring is refused", async () => {
    expect((await cli(["plan", "set", "personal"])).code).toBe(0);
    try {
      const run = await cli([
        "billing",
        "configure",
        "--provider",
        "stripe",
        "--api-key-file",
        secretFile("api-key-6", API_KEY),
        "--webhook-secret-file",
        secretFile("webhook-secret-6", SECRET),
      ]);
      expect(run.code).toBe(1);
      expect(run.stderr).toContain("plan");
    } finally {
      await cli(["plan", "set", "self_hosted"]);
    }
  });
});
