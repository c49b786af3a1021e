import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import { finishInit, initialise } from "../../src/cli/init.ts";
import { resolveConfig } from "../../src/config.ts";
import { DEFAULT_BODY_LIMIT } from "../../src/http/body.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { LicensingClient, MemoryStorage } from "../../src/sdk/index.ts";
import { PACKAGE_ENTRIES } from "../../src/sdk/offline.ts";
import { readStoredZip } from "../../src/sdk/zip.ts";
import { buildDeps, openKeystore, startServer } from "../../src/server.ts";
import { openStore, type Store } from "../../src/store/db.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import { managementRequest } from "../support/management-request.ts";
import { MACHINE } from "../support/offline.ts";
import { makeSpecialFiles, stillSpecial } from "../support/special-files.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * The air-gapped command and the API route, side by side on one data dir: `licensing offline
 * issue` and `licensing seal` run through the real command-line entry point, and the same SDK code
 * accepts what each produced.
 */
const BASE = "http://licensing.test";
const work = mkdtempSync(join(tmpdir(), "offline-cli-"));
const dataDir = join(work, "data");
let store: Store;
let app: ReturnType<typeof createApp>;
let liveKey: string;
let ids: { productId: string; licenseId: string; licenseKey: string };
let policyId: string;
// biome-ignore lint/suspicious/noExplicitAny: the integration config is JSON from the API.
let config: any;

async function api(method: string, path: string, body?: unknown) {
  const response = await app.handle(managementRequest(BASE, liveKey, method, path, body));
  return { status: response.status, bytes: new Uint8Array(await response.arrayBuffer()) };
}
const json = (bytes: Uint8Array) => JSON.parse(new TextDecoder().decode(bytes));
const utf8 = (text: string) => new TextEncoder().encode(text);

/** POSTs `{"request": <bytes as they are>}`: the route's answer to a request file, byte for byte. */
async function rawApi(path: string, request: Uint8Array) {
  const body = new Uint8Array([...utf8('{"request":'), ...request, ...utf8("}")]);
  const response = await app.handle(
    new Request(`${BASE}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${liveKey}`, "content-type": "application/json" },
      body,
    }),
  );
  const error = (await response.json()).error as { code: string; details: { errors?: object } };
  return { code: error.code, fields: Object.keys(error.details.errors ?? {}) };
}

/** Runs the command line in this process and captures what it prints. */
const cli = (args: string[]) => runInProcess(args, work);

/** `licensing offline issue` for this store: a request file in the work dir, the package's file name, more flags. */
const issue = (request: string, out: string, ...more: string[]) =>
  cli([
    "offline",
    "issue",
    "--data-dir",
    dataDir,
    ...more,
    "--license",
    ids.licenseId,
    "--request",
    request,
    "--out",
    out,
  ]);

const device = () =>
  new LicensingClient({
    config,
    storage: new MemoryStorage(),
    fetch: ((url: string, init?: RequestInit) => app.handle(new Request(url, init))) as never,
  });

beforeAll(async () => {
  const init = initialise(resolveConfig({ "data-dir": dataDir }, {}, work));
  // As `licensing init` does once the keys are shown: the staging folder and the lock go.
  finishInit(init);
  liveKey = init.apiKeys.live;
  const passphrase = readFileSync(join(dataDir, "keystore.passphrase"), "utf8").trim();
  store = openStore(join(dataDir, "licensing.db"));
  app = createApp(buildDeps(store, openKeystore(dataDir, passphrase)), { baseUrl: BASE });
  const product = json(
    (await api("POST", "/mgmt/v1/products", { name: "Air", code: "air", environment: "live" })).bytes,
  ).data;
  const policy = json(
    (
      await api("POST", "/mgmt/v1/policies", {
        product_id: product.public_id,
        name: "Off",
        validation_mode: "hybrid",
        max_machines: 5,
        entitlements: { pro: true },
      })
    ).bytes,
  ).data;
  const license = json(
    (await api("POST", "/mgmt/v1/licenses", { product_id: product.public_id, policy_id: policy.public_id }))
      .bytes,
  ).data;
  ids = { productId: product.public_id, licenseId: license.public_id, licenseKey: license.key };
  policyId = policy.public_id;
  config = json((await api("GET", `/mgmt/v1/products/${product.public_id}/integration-config`)).bytes).data
    .config;
});
afterAll(() => {
  store?.close();
  rmSync(work, { recursive: true, force: true });
});

describe("licensing offline issue", () => {
  test("the command and the API route make packages the same SDK code accepts", async () => {
    const viaCli = device();
    writeFileSync(
      join(work, "request.json"),
      JSON.stringify(await viaCli.createOfflineRequest({ machineInfo: MACHINE })),
    );
    const run = await issue("request.json", "package.zip", "--base-url", BASE);
    expect(run.stderr).toBe("");
    expect(run.code).toBe(0);
    expect(run.stdout).toMatch(/^Offline package olp_\w+ for license lic_\w+ written to /);
    const fromCli = new Uint8Array(readFileSync(join(work, "package.zip")));
    expect((await viaCli.loadOfflinePackage(fromCli)).licenseId).toBe(ids.licenseId);
    expect(await viaCli.licenseState()).toBe("valid");

    const viaApi = device();
    const response = await api("POST", `/mgmt/v1/licenses/${ids.licenseId}/offline-certificates`, {
      request: await viaApi.createOfflineRequest({ machineInfo: MACHINE }),
    });
    expect(response.status).toBe(200);
    expect((await viaApi.loadOfflinePackage(response.bytes)).licenseId).toBe(ids.licenseId);
    expect(await viaApi.hasEntitlement("pro")).toBe(true);
  });

  test("it is audited like the route, with the operating-system user as the actor", async () => {
    const events = json((await api("GET", "/mgmt/v1/events")).bytes).data.filter(
      (e: { type: string }) => e.type === "license.offline_package_issued",
    );
    expect(events.map((e: { actor: { type: string } }) => e.actor.type).sort()).toEqual(["api_key", "cli"]);
    // The name is what the environment said; the uid is the process's own, which it cannot say otherwise.
    const byCli = events.find((e: { actor: { type: string } }) => e.actor.type === "cli");
    if (typeof process.getuid === "function") expect(byCli.actor.uid).toBe(process.getuid());
  });

  test("an identical request gives the same bytes again; --json says so", async () => {
    const again = await issue("request.json", "again.zip", "--json");
    expect(again.code).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({ license_id: ids.licenseId, replayed: true });
    expect(readFileSync(join(work, "again.zip")).equals(readFileSync(join(work, "package.zip")))).toBe(true);
  });

  test("a 250-character --out name is written; one longer than the system allows is refused before anything is issued", async () => {
    const long = `${"p".repeat(246)}.zip`;
    const run = await issue("request.json", long, "--json");
    expect([run.code, run.stderr, JSON.parse(run.stdout).replayed]).toEqual([0, "", true]);
    expect(readFileSync(join(work, long)).equals(readFileSync(join(work, "package.zip")))).toBe(true);

    const before = storeDigest(store.sqlite);
    const tooLong = `${"p".repeat(256)}.zip`;
    writeFileSync(
      join(work, "too-long.json"),
      JSON.stringify(
        await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "too-long" } }),
      ),
    );
    expect(await issue("too-long.json", tooLong)).toEqual({
      code: 1,
      stdout: "",
      stderr: `licensing offline issue: cannot write ${tooLong}: its name is too long\n`,
    });
    expect(storeDigest(store.sqlite)).toBe(before);
  });

  test("the service's refusals come back as one line and exit 1; a missing flag is a usage error", async () => {
    writeFileSync(join(work, "bad.json"), JSON.stringify({ format: "service-offline-request-v1" }));
    const bad = await issue("bad.json", "x.zip");
    expect([bad.code, bad.stderr]).toEqual([1, expect.stringContaining("VALIDATION_FAILED")]);
    expect(bad.stderr).toContain("request.product_id");
    // One sentence: the message, then the fields.
    expect(bad.stderr).toStartWith(
      "licensing offline issue: bad.json: VALIDATION_FAILED: Some values are invalid: request",
    );
    const unknown = await cli([
      "offline",
      "issue",
      "--data-dir",
      dataDir,
      "--license",
      "lic_01M81Z00000000000000000000",
      "--request",
      "request.json",
      "--out",
      "x.zip",
    ]);
    expect([unknown.code, unknown.stderr]).toEqual([1, expect.stringContaining("no license")]);
    const other = device();
    const request = await other.createOfflineRequest({ machineInfo: MACHINE });
    writeFileSync(join(work, "tampered.json"), JSON.stringify({ ...request, nonce: `${request.nonce}x` }));
    const tampered = await issue("tampered.json", "x.zip");
    expect([tampered.code, tampered.stderr]).toEqual([1, expect.stringContaining("VALIDATION_FAILED")]);
    expect(tampered.stderr).toContain("request.device_proof");
    expect(existsSync(join(work, "x.zip"))).toBe(false);
    expect((await cli(["offline", "issue", "--data-dir", dataDir])).code).toBe(2);
  });

  test("an --out named with a trailing slash, or in /proc, is refused before anything is issued and nothing is made", async () => {
    writeFileSync(
      join(work, "slash.json"),
      JSON.stringify(await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "slash" } })),
    );
    mkdirSync(join(work, "pkgdir"));
    const files = readdirSync(work);
    const before = storeDigest(store.sqlite);
    const refusals = [
      ["newdir/", 'a file is needed, and a name ending in "/" is a directory\'s'],
      ["pkgdir/", 'a file is needed, and a name ending in "/" is a directory\'s'],
      ["/proc/self/package.zip", "it is in /proc, the kernel's process interface, not a place for files"],
    ];
    for (const [out, reason] of refusals) {
      expect(await issue("slash.json", out ?? "")).toEqual({
        code: 1,
        stdout: "",
        stderr: `licensing offline issue: cannot write ${out}: ${reason}\n`,
      });
    }
    expect(storeDigest(store.sqlite)).toBe(before);
    expect(readdirSync(work).sort()).toEqual(files.sort());
    expect(readdirSync(join(work, "pkgdir"))).toEqual([]);
  });

  test("an --out it cannot write (no such directory, a directory in its place) is refused before anything is issued", async () => {
    const client = device();
    writeFileSync(
      join(work, "unwritten.json"),
      JSON.stringify(
        await client.createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "unwritten" } }),
      ),
    );
    mkdirSync(join(work, "a-directory.zip"));
    const files = readdirSync(work);
    const before = storeDigest(store.sqlite);
    const outs = [join("no-such-dir", "package.zip"), "a-directory.zip"];
    const runs = [];
    for (const out of outs) runs.push(await issue("unwritten.json", out));
    expect(runs.map((run) => [run.code, run.stdout])).toEqual([
      [1, ""],
      [1, ""],
    ]);
    // No package row, no audit event, no activation holding a machine slot.
    expect(storeDigest(store.sqlite)).toBe(before);
    expect(runs.map((run) => run.stderr)).toEqual(
      outs.map((out) => expect.stringContaining(`cannot write ${out}:`)),
    );
    expect(existsSync(join(work, "no-such-dir"))).toBe(false);
    expect(readdirSync(join(work, "a-directory.zip"))).toEqual([]);

    const written = await issue("unwritten.json", "unwritten.zip", "--json");
    expect(written.code).toBe(0);
    expect(JSON.parse(written.stdout)).toMatchObject({ replayed: false });
    // Nor do the refusals before this one leave the temp file the package was to be written to.
    expect(readdirSync(work).sort()).toEqual([...files, "unwritten.zip"].sort());
  });

  test("an --out that is a FIFO, a socket or a device node, or a link to one, is refused before anything is issued and stays as it was; a link to a file is replaced itself", async () => {
    // A device that has no package: a refusal after issuing would leave its package and slot.
    writeFileSync(
      join(work, "special.json"),
      JSON.stringify(
        await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "special" } }),
      ),
    );
    const special = await makeSpecialFiles(work, ".special.zip");
    try {
      const before = storeDigest(store.sqlite);
      for (const { name, kind } of special.files) {
        const run = await issue("special.json", name);
        expect({ name, ...run }).toEqual({
          name,
          code: 1,
          stdout: "",
          stderr: `licensing offline issue: cannot write ${name}: it is ${kind}, not a regular file\n`,
        });
        expect(stillSpecial(join(work, name))).toBe(true);
      }
      expect(storeDigest(store.sqlite)).toBe(before);

      // A link to one names it (as /dev/stdout names a terminal or a pipe): refused, and kept.
      const [fifo] = special.files;
      symlinkSync(join(work, fifo?.name ?? ""), join(work, "fifo-link.zip"));
      expect(await issue("special.json", "fifo-link.zip")).toEqual({
        code: 1,
        stdout: "",
        stderr:
          "licensing offline issue: cannot write fifo-link.zip: it is a symbolic link to a FIFO, not to a regular file\n",
      });
      expect(lstatSync(join(work, "fifo-link.zip")).isSymbolicLink()).toBe(true);
      expect(storeDigest(store.sqlite)).toBe(before);

      // A link to a file is an ordinary destination: the rename replaces the link, never what it
      // leads to. The first test's request, whose package exists: this write takes no machine slot.
      writeFileSync(join(work, "older.zip"), "an older package");
      symlinkSync(join(work, "older.zip"), join(work, "file-link.zip"));
      const linked = await issue("request.json", "file-link.zip", "--json");
      expect([linked.code, linked.stderr]).toEqual([0, ""]);
      expect(lstatSync(join(work, "file-link.zip")).isFile()).toBe(true);
      expect(readFileSync(join(work, "older.zip"), "utf8")).toBe("an older package");
      expect(stillSpecial(join(work, fifo?.name ?? ""))).toBe(true);
    } finally {
      await special.close();
    }
  });

  test("offline issue refuses an --out inside the data directory and leaves the keystore and the store as they were", async () => {
    writeFileSync(
      join(work, "inside.json"),
      JSON.stringify(
        await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "inside" } }),
      ),
    );
    symlinkSync(dataDir, join(work, "data-link"));
    // The store's own files change under the open connection; its rows are what must not.
    const state = () => ({
      names: readdirSync(dataDir).sort(),
      keystore: readFileSync(join(dataDir, "keystore.json"), "utf8"),
      store: storeDigest(store.sqlite),
    });
    const before = state();
    const outs = [
      join(dataDir, "keystore.json"),
      "data/../data/licensing.db",
      "data-link/keystore.json",
      "data/package.zip",
    ];
    for (const out of outs) {
      const run = await issue("inside.json", out);
      expect({ out, ...run }).toEqual({
        out,
        code: 1,
        stdout: "",
        stderr: `licensing offline issue: cannot write ${out}: it is in the data directory ${dataDir}, which holds only the service's own files\n`,
      });
    }
    // No package row, audit event or machine slot either.
    expect(state()).toEqual(before);
  });

  test("offline issue refuses an --out that is the request file, however it is spelled, and leaves the request as it was; an older package there is still replaced", async () => {
    const request = JSON.stringify(
      await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "same" } }),
    );
    writeFileSync(join(work, "same.json"), request);
    symlinkSync(join(work, "same.json"), join(work, "same-link.json"));
    symlinkSync(work, join(work, "work-link"));
    const before = storeDigest(store.sqlite);
    const outs = ["same.json", "no-such-dir/../same.json", "same-link.json", "work-link/same.json"];
    for (const out of outs) {
      const run = await issue("same.json", out);
      expect({ out, ...run }).toEqual({
        out,
        code: 1,
        stdout: "",
        stderr: `licensing offline issue: cannot write ${out}: it is the request file\n`,
      });
    }
    expect(readFileSync(join(work, "same.json"), "utf8")).toBe(request);
    expect(storeDigest(store.sqlite)).toBe(before);

    // A file written before is an ordinary destination: the documented recovery (the same request
    // again) must be able to replace it.
    writeFileSync(join(work, "same.zip"), "an older package");
    const again = await issue("request.json", "same.zip", "--json");
    expect([again.code, JSON.parse(again.stdout).replayed]).toEqual([0, true]);
    expect(readFileSync(join(work, "same.zip")).equals(readFileSync(join(work, "package.zip")))).toBe(true);
  });

  test("offline issue refuses an --out that is the keystore's passphrase file kept outside the data directory, which stays as it was", async () => {
    const passphrase = readFileSync(join(dataDir, "keystore.passphrase"));
    writeFileSync(join(work, "outside.passphrase"), passphrase, { mode: 0o600 });
    symlinkSync(join(work, "outside.passphrase"), join(work, "passphrase-link"));
    const before = storeDigest(store.sqlite);
    for (const out of ["outside.passphrase", "passphrase-link"]) {
      const run = await issue("request.json", out, "--passphrase-file", "outside.passphrase");
      expect({ out, ...run }).toEqual({
        out,
        code: 1,
        stdout: "",
        stderr: `licensing offline issue: cannot write ${out}: it is the keystore's passphrase file\n`,
      });
    }
    expect(readFileSync(join(work, "outside.passphrase")).equals(passphrase)).toBe(true);
    expect(storeDigest(store.sqlite)).toBe(before);
  });

  // An immutable file (chattr +i) refuses the rename over it even to root: the one way to make
  // the write fail after the package is issued without reaching into the command.
  const chattr = (flag: "+i" | "-i", path: string) =>
    Bun.spawnSync(["chattr", flag, path], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;
  const canMakeImmutable = (() => {
    const probe = join(work, "immutable-probe");
    writeFileSync(probe, "");
    const can = chattr("+i", probe) && chattr("-i", probe);
    rmSync(probe, { force: true });
    return can;
  })();

  test.skipIf(!canMakeImmutable)(
    "a write that fails after the package is issued names the package and how to get the same bytes again, and running it again does",
    async () => {
      writeFileSync(
        join(work, "locked.json"),
        JSON.stringify(
          await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "locked" } }),
        ),
      );
      const target = join(work, "locked.zip");
      writeFileSync(target, "an older package");
      const files = readdirSync(work);
      const packageCount = () =>
        (store.sqlite.query("SELECT count(*) AS n FROM offline_packages").get() as { n: number }).n;
      const before = packageCount();
      expect(chattr("+i", target)).toBe(true);
      let failed: Awaited<ReturnType<typeof issue>>;
      try {
        failed = await issue("locked.json", "locked.zip", "--expires-at", "2099-01-01T00:00:00Z");
      } finally {
        chattr("-i", target);
      }
      expect([failed.code, failed.stdout]).toEqual([1, ""]);
      const id = /offline package (\S+) for license/.exec(failed.stderr)?.[1] ?? "";
      expect(id).toStartWith("olp_");
      expect(failed.stderr).toContain(
        `for license ${ids.licenseId} is issued but could not be written to ${target}:`,
      );
      expect(failed.stderr).toContain("with the same request file and --expires-at");
      // The temp file is gone and the file in the way is untouched.
      expect(readdirSync(work)).toEqual(files);
      expect(readFileSync(target, "utf8")).toBe("an older package");

      const again = await issue(
        "locked.json",
        "locked.zip",
        "--expires-at",
        "2099-01-01T00:00:00Z",
        "--json",
      );
      expect(again.code).toBe(0);
      expect(JSON.parse(again.stdout)).toMatchObject({ package_id: id, replayed: true });
      // Issued once: the second run wrote the stored package, it issued nothing new.
      expect(packageCount()).toBe(before + 1);
      expect(readFileSync(target).subarray(0, 2).toString()).toBe("PK");
    },
  );

  test("an --expires-at that is not an RFC 3339 date-time is a usage error (exit 2, one line), not a refusal of the request file", async () => {
    for (const expiresAt of ["nope", "2030-01-31", "2030-02-31T00:00:00Z"]) {
      const run = await issue("request.json", "dated.zip", "--expires-at", expiresAt);
      expect({ expiresAt, ...run }).toEqual({
        expiresAt,
        code: 2,
        stdout: "",
        stderr:
          "licensing offline issue: --expires-at must be an RFC 3339 date-time, e.g. 2030-01-31T00:00:00Z\n" +
          'Run "licensing offline issue --help" for its options.\n',
      });
    }
    expect(existsSync(join(work, "dated.zip"))).toBe(false);
  });

  test("a request file the route would refuse as a body (NUL, lone surrogate, repeated member, bad UTF-8) is refused with the route's code and field, and nothing is issued", async () => {
    const packages = () =>
      store.sqlite.query<{ n: number }, []>("SELECT count(*) AS n FROM offline_packages").get()?.n;
    const before = packages();
    // Signed by the device, so nothing after the body checks would refuse the first two.
    const signed = async (hostname: string) =>
      JSON.stringify(await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname } }));
    // "lab" + a lone 0xE9: é as Latin-1 writes it, not UTF-8.
    const latin1 = (text: string) => {
      const [head, tail] = text.split('"lab"');
      return Uint8Array.from([...utf8(`${head}"lab`), 0xe9, ...utf8(`"${tail}`)]);
    };
    const cases: [string, Uint8Array, string, string | null][] = [
      ["nul", utf8(await signed("lab\u0000pc")), "VALIDATION_FAILED", "request.machine_info.hostname"],
      [
        "duplicate",
        utf8((await signed("b")).replace('"hostname":"b"', '"hostname":"a","hostname":"b"')),
        "INVALID_REQUEST",
        null,
      ],
      [
        "surrogate",
        utf8((await signed("lab")).replace('"hostname":"lab"', '"hostname":"lab\\udc00"')),
        "VALIDATION_FAILED",
        "request.machine_info.hostname",
      ],
      ["latin1", latin1(await signed("lab")), "INVALID_REQUEST", null],
    ];
    for (const [name, bytes, code, field] of cases) {
      const viaApi = await rawApi(`/mgmt/v1/licenses/${ids.licenseId}/offline-certificates`, bytes);
      expect([name, viaApi.code, viaApi.fields]).toEqual([name, code, field ? [field] : []]);
      writeFileSync(join(work, `${name}.json`), bytes);
      const run = await issue(`${name}.json`, `${name}.zip`);
      expect([name, run.code, run.stdout]).toEqual([name, 1, ""]);
      expect(run.stderr).toContain(`${code}:`);
      if (field) expect(run.stderr).toContain(field);
      expect(existsSync(join(work, `${name}.zip`))).toBe(false);
    }
    expect(packages()).toBe(before);
  });
});

test("the size limit is the route's: a file the route would refuse once wrapped in its body is refused, one byte less is read", async () => {
  const wrapper = '{"request":}'.length;
  // Whitespace, then an empty object: well-formed JSON whose size alone decides the first refusal.
  const padded = (size: number) => utf8(`${" ".repeat(size - 2)}{}`);
  const over = padded(DEFAULT_BODY_LIMIT - wrapper + 1);
  expect((await rawApi(`/mgmt/v1/licenses/${ids.licenseId}/offline-certificates`, over)).code).toBe(
    "PAYLOAD_TOO_LARGE",
  );
  writeFileSync(join(work, "over.json"), over);
  expect((await issue("over.json", "over.zip")).stderr).toContain("PAYLOAD_TOO_LARGE:");
  // A request "file" that never ends is refused by the same limit, not read into memory.
  expect((await issue("/dev/zero", "zero.zip")).stderr).toContain("PAYLOAD_TOO_LARGE:");
  const within = padded(DEFAULT_BODY_LIMIT - wrapper);
  expect((await rawApi(`/mgmt/v1/licenses/${ids.licenseId}/offline-certificates`, within)).code).toBe(
    "VALIDATION_FAILED",
  );
  writeFileSync(join(work, "within.json"), within);
  expect((await issue("within.json", "within.zip")).stderr).toContain("VALIDATION_FAILED:");
});

describe("licensing seal", () => {
  test("it needs only the public line, and what it writes opens on a licensed device", async () => {
    const enabled = json((await api("POST", `/mgmt/v1/products/${ids.productId}/sealed-files`)).bytes).data;
    const plain = new Uint8Array(150_000).map((_, i) => i % 241);
    writeFileSync(join(work, "asset.bin"), plain);
    const run = await cli([
      "seal",
      "--sealing-key",
      enabled.current_key.sealing_key,
      "--entitlement",
      "pro",
      "--json",
      "asset.bin",
      "asset.sealed",
    ]);
    expect(run.code).toBe(0);
    expect(JSON.parse(run.stdout)).toMatchObject({
      product_id: ids.productId,
      entitlement: "pro",
      plaintext_bytes: 150_000,
      chunks: 3,
    });
    const app = device();
    await app.activate({ licenseKey: ids.licenseKey, machineInfo: MACHINE });
    const opened = await app.openSealedFile(new Uint8Array(readFileSync(join(work, "asset.sealed"))));
    expect(new Uint8Array(await new Response(opened.stream).arrayBuffer())).toEqual(plain);
  });

  test("a mistyped sealing key or a missing file is refused before anything is written", async () => {
    const typo = await cli([
      "seal",
      "--sealing-key",
      "service-sealing-key-v1:prod_x:k_00:AAAA",
      "asset.bin",
      "out.sealed",
    ]);
    expect([typo.code, typo.stderr]).toEqual([2, expect.stringContaining("--sealing-key")]);
    const enabled = json((await api("GET", `/mgmt/v1/products/${ids.productId}/sealed-files`)).bytes).data;
    const missing = await cli([
      "seal",
      "--sealing-key",
      enabled.current_key.sealing_key,
      "nothing.bin",
      "out.sealed",
    ]);
    expect([missing.code, missing.stderr]).toEqual([1, expect.stringContaining("no such file")]);
    expect(existsSync(join(work, "out.sealed"))).toBe(false);
    expect((await cli(["seal", "--data-dir", dataDir, "asset.bin", "out.sealed"])).code).toBe(2);
  });

  test("an --entitlement that is not an entitlement name is a usage error (exit 2, one line), and nothing is written", async () => {
    const enabled = json((await api("GET", `/mgmt/v1/products/${ids.productId}/sealed-files`)).bytes).data;
    writeFileSync(join(work, "named.bin"), "for pro users only");
    for (const entitlement of ["für", "Pro", "-pro", "a".repeat(65)]) {
      const run = await cli([
        "seal",
        "--sealing-key",
        enabled.current_key.sealing_key,
        "--entitlement",
        entitlement,
        "named.bin",
        "named.sealed",
      ]);
      expect({ entitlement, ...run }).toEqual({
        entitlement,
        code: 2,
        stdout: "",
        stderr:
          "licensing seal: --entitlement must be 1-64 of a-z 0-9 _ . : - starting with a letter or digit\n" +
          'Run "licensing seal --help" for its options.\n',
      });
    }
    expect(existsSync(join(work, "named.sealed"))).toBe(false);
  });
});

describe("the issuer", () => {
  test("without --base-url its certificate names as issuer the base URL the last server on the data directory ran with", async () => {
    const issuerOf = (zip: Uint8Array) => {
      const jwt = new TextDecoder().decode(readStoredZip(zip, PACKAGE_ENTRIES).get("license.jwt"));
      return JSON.parse(Buffer.from(jwt.split(".")[1] ?? "", "base64url").toString()).iss;
    };
    const passphrase = readFileSync(join(dataDir, "keystore.passphrase"), "utf8").trim();
    const serverConfig = resolveConfig(
      { "data-dir": dataDir, "base-url": "https://licensing.example.com" },
      {},
      work,
    );
    await startServer({ config: { ...serverConfig, port: 0 }, passphrase, logger: silentLogger }).shutdown(
      "test",
    );
    // A license of its own: the tests above used the first one's machine slots.
    const license = json(
      (await api("POST", "/mgmt/v1/licenses", { product_id: ids.productId, policy_id: policyId })).bytes,
    ).data;
    for (const [name, flags, issuer] of [
      ["recorded", [], "https://licensing.example.com"],
      ["given", ["--base-url", BASE], BASE],
    ] as const) {
      const viaCli = device();
      writeFileSync(
        join(work, `${name}.json`),
        JSON.stringify(await viaCli.createOfflineRequest({ machineInfo: MACHINE })),
      );
      const run = await cli([
        "offline",
        "issue",
        "--data-dir",
        dataDir,
        ...flags,
        "--license",
        license.public_id,
        "--request",
        `${name}.json`,
        "--out",
        `${name}.zip`,
      ]);
      expect(run.code).toBe(0);
      expect(issuerOf(new Uint8Array(readFileSync(join(work, `${name}.zip`))))).toBe(issuer);
    }
  });
});

describe("an ended plan", () => {
  test("offline issue refuses as the route does (402 PLAN_ENDED), naming the end and how to change it, and issues nothing", async () => {
    writeFileSync(
      join(work, "ended.json"),
      JSON.stringify(await device().createOfflineRequest({ machineInfo: { ...MACHINE, hostname: "ended" } })),
    );
    const plan = JSON.parse((await cli(["plan", "show", "--json", "--data-dir", dataDir])).stdout).code;
    const endedAt = "2020-01-01T00:00:00.000Z";
    const ended = await cli([
      "plan",
      "set",
      plan,
      "--ends-at",
      endedAt,
      "--allow-past",
      "--data-dir",
      dataDir,
    ]);
    expect(ended.code).toBe(0);
    try {
      const route = await rawApi(
        `/mgmt/v1/licenses/${ids.licenseId}/offline-certificates`,
        new Uint8Array(readFileSync(join(work, "ended.json"))),
      );
      expect(route.code).toBe("PLAN_ENDED");
      const before = storeDigest(store.sqlite);
      expect(await issue("ended.json", "ended.zip")).toEqual({
        code: 1,
        stdout: "",
        stderr:
          `licensing offline issue: PLAN_ENDED: The workspace subscription has ended (plan ${plan}, ended ${endedAt}); ` +
          'nothing is issued until "licensing plan set" gives the workspace a plan that has not ended\n',
      });
      expect(storeDigest(store.sqlite)).toBe(before);
      expect(existsSync(join(work, "ended.zip"))).toBe(false);
    } finally {
      expect((await cli(["plan", "set", plan, "--data-dir", dataDir])).code).toBe(0);
    }
  });
});
