import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Keystore, KeystoreError, type KeystoreErrorReason } from "../../src/crypto/keystore.ts";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import { AdjustableClock } from "../../src/domain/clock.ts";
import { IdGenerator } from "../../src/domain/ids.ts";
import { ONLINE_MASTER_ID, TrustService } from "../../src/modules/trust/service.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";

const PASSPHRASE = "a keystore passphrase for tests";
const FAST = { scryptN: 1024 };

let dir: string;
let path: string;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "licensing-keystore-"));
  path = join(dir, "keystore.json");
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

// biome-ignore lint/suspicious/noExplicitAny: the tests edit the raw JSON document on purpose.
type RawDocument = any;
const readDoc = (): RawDocument => JSON.parse(readFileSync(path, "utf8"));
const writeDoc = (doc: RawDocument) => writeFileSync(path, JSON.stringify(doc, null, 2));

function reasonOf(open: () => unknown): KeystoreErrorReason | "no error" {
  try {
    open();
    return "no error";
  } catch (error) {
    if (error instanceof KeystoreError) return error.reason;
    throw error;
  }
}

/** Changes one character of a base64url string to another valid one. */
const flipChar = (value: string, at = 4): string =>
  value.slice(0, at) + (value[at] === "A" ? "B" : "A") + value.slice(at + 1);

describe("creating and opening", () => {
  test("a created keystore opens again with the same passphrase and the same secrets", () => {
    const created = Keystore.create(path, PASSPHRASE, FAST);
    const opened = Keystore.open(path, PASSPHRASE);
    expect(opened.entries()).toEqual(created.entries());
    for (const entry of created.entries()) {
      expect(Buffer.from(opened.secret(entry.id))).toEqual(Buffer.from(created.secret(entry.id)));
    }
    expect(opened.entries().map((e) => e.id)).toEqual(["data-key", "root-live", "root-test"]);
    expect(opened.secret("data-key").length).toBe(32);
  });

  test("the keystore file is readable by its owner only", () => {
    Keystore.create(path, PASSPHRASE, FAST);
    expect(statSync(path).mode & 0o777).toBe(0o600);
  });

  test("no secret appears in the file in the clear", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    const text = readFileSync(path, "utf8");
    for (const entry of store.entries()) {
      const secret = Buffer.from(store.secret(entry.id));
      expect(text).not.toContain(secret.toString("base64url"));
      expect(text).not.toContain(secret.toString("base64"));
      expect(text).not.toContain(secret.toString("hex"));
    }
    expect(text).not.toContain(PASSPHRASE);
  });

  test("an existing keystore is never overwritten by create", () => {
    Keystore.create(path, PASSPHRASE, FAST);
    const before = readFileSync(path, "utf8");
    expect(() => Keystore.create(path, "another passphrase", FAST)).toThrow(KeystoreError);
    expect(readFileSync(path, "utf8")).toBe(before);
  });

  test("a missing file is reported as missing", () => {
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("missing");
  });
});

describe("refusing bad keystores", () => {
  beforeEach(() => {
    Keystore.create(path, PASSPHRASE, FAST);
  });

  test("a wrong passphrase is reported as wrong_passphrase", () => {
    expect(reasonOf(() => Keystore.open(path, "not the passphrase"))).toBe("wrong_passphrase");
  });

  test("flipping a byte of an entry's ciphertext is reported as tampered", () => {
    const doc = readDoc();
    doc.entries[1].ciphertext = flipChar(doc.entries[1].ciphertext);
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("tampered");
  });

  test("removing an entry is reported as tampered", () => {
    const doc = readDoc();
    doc.entries.splice(2, 1);
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("tampered");
  });

  test("reordering entries is reported as tampered", () => {
    const doc = readDoc();
    doc.entries.reverse();
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("tampered");
  });

  test("editing an entry's metadata is reported as tampered", () => {
    const doc = readDoc();
    doc.entries[1].environment = "test";
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("tampered");
  });

  test("editing the document MAC is reported as tampered", () => {
    const doc = readDoc();
    doc.mac = flipChar(doc.mac);
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("tampered");
  });

  test("a truncated file is reported as malformed", () => {
    const text = readFileSync(path, "utf8");
    writeFileSync(path, text.slice(0, Math.floor(text.length / 2)));
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("malformed");
  });

  test("an empty file is reported as malformed", () => {
    writeFileSync(path, "");
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("malformed");
  });

  test("JSON that is not a keystore is reported as malformed", () => {
    writeFileSync(path, JSON.stringify({ format: "something-else" }));
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("malformed");
  });

  test("an absurd scrypt cost is refused as malformed before any work is done", () => {
    const doc = readDoc();
    doc.kdf.N = 2 ** 30;
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("malformed");
  });

  test.each([
    ["r", 2 ** 20],
    ["p", 64],
    ["N", 2 ** 18],
    ["N", 3000],
  ])("a keystore whose scrypt %s was raised to %d is refused, not computed", (field, value) => {
    const doc = readDoc();
    doc.kdf[field] = value;
    writeDoc(doc);
    expect(reasonOf(() => Keystore.open(path, PASSPHRASE))).toBe("malformed");
  });
});

describe("adding entries", () => {
  const entry = (id: string) => ({
    metadata: {
      id,
      kind: "product_signing_key" as const,
      environment: "live" as const,
      alg: "ed25519",
      created_at: "2026-01-01T00:00:00.000Z",
    },
    secret: new Uint8Array(crypto.getRandomValues(new Uint8Array(48))),
  });

  test("an added entry is persisted and survives reopening", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    const item = entry("signing-1");
    store.add([item]);
    const reopened = Keystore.open(path, PASSPHRASE);
    expect(reopened.has("signing-1")).toBe(true);
    expect(Buffer.from(reopened.secret("signing-1"))).toEqual(Buffer.from(item.secret));
    expect(reopened.entries().find((e) => e.id === "signing-1")).toEqual(item.metadata);
    expect(statSync(path).mode & 0o777).toBe(0o600);
  });

  test("adding leaves no temporary file behind, only the empty lock file", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    store.add([entry("signing-1"), entry("signing-2")]);
    expect(readdirSync(dir).sort()).toEqual(["keystore.json", "keystore.json.lock"]);
    expect(statSync(`${path}.lock`).size).toBe(0);
  });

  test("a failed add changes neither the file nor the open keystore", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    const before = readFileSync(path, "utf8");
    // The second item reuses an id, so the whole batch is refused.
    expect(() => store.add([entry("signing-1"), entry("data-key")])).toThrow(KeystoreError);
    expect(readFileSync(path, "utf8")).toBe(before);
    expect(store.has("signing-1")).toBe(false);
    expect(store.entries().map((e) => e.id)).toEqual(["data-key", "root-live", "root-test"]);
  });

  test("a failed add keeps the secrets of the entries that were already there", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    expect(() => store.add([entry("signing-1"), entry("data-key")])).toThrow(KeystoreError);
    expect(store.has("data-key")).toBe(true);
  });

  test("when the file cannot be written the old file and state stay", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    const before = readFileSync(path, "utf8");
    // A directory where the temporary file should go makes the write fail even for root.
    mkdirSync(`${path}.tmp-${process.pid}`);
    expect(() => store.add([entry("signing-1")])).toThrow();
    expect(readFileSync(path, "utf8")).toBe(before);
    expect(store.has("signing-1")).toBe(false);
    expect(Keystore.open(path, PASSPHRASE).has("signing-1")).toBe(false);
  });
});

describe("two processes on one keystore", () => {
  const entryNamed = (id: string) => ({
    metadata: {
      id,
      kind: "product_signing_key" as const,
      environment: "live" as const,
      alg: "ed25519",
      created_at: "2026-01-01T00:00:00.000Z",
    },
    secret: new Uint8Array([1, 2, 3]),
  });

  test("adds from two open copies both survive: each starts from the file as it is", () => {
    const server = Keystore.create(path, PASSPHRASE, FAST);
    const cli = Keystore.open(path, PASSPHRASE);
    cli.add([entryNamed("from-cli")]);
    server.add([entryNamed("from-server")]);
    const reopened = Keystore.open(path, PASSPHRASE);
    expect(reopened.has("from-cli")).toBe(true);
    expect(reopened.has("from-server")).toBe(true);
  });

  test("ensure from two open copies makes the entry once: the second copy reads the first's instead of refusing it as existing", () => {
    const server = Keystore.create(path, PASSPHRASE, FAST);
    const cli = Keystore.open(path, PASSPHRASE);
    const made = cli.ensure("shared", () => entryNamed("shared"));
    let madeAgain = false;
    const read = server.ensure("shared", () => {
      madeAgain = true;
      return { ...entryNamed("shared"), secret: new Uint8Array([9, 9, 9]) };
    });
    expect(madeAgain).toBe(false);
    expect([...read]).toEqual([...made]);
    expect([...Keystore.open(path, PASSPHRASE).secret("shared")]).toEqual([1, 2, 3]);
  });

  test("a TrustService started beside another process's first one uses the online key master that process made", () => {
    const first = Keystore.create(path, PASSPHRASE, FAST);
    const second = Keystore.open(path, PASSPHRASE);
    const store = openStore(join(dir, "licensing.db"));
    try {
      migrate(store.sqlite);
      const deps = (keystore: Keystore) => ({
        db: store.db,
        sqlite: store.sqlite,
        clock: new AdjustableClock(),
        ids: new IdGenerator(),
        secrets: new SecretBox(first.secret("data-key")),
        keystore,
      });
      new TrustService(deps(first));
      // Opened before the first made the master: its own copy does not have it yet.
      expect(second.has(ONLINE_MASTER_ID)).toBe(false);
      new TrustService(deps(second));
      expect([...second.secret(ONLINE_MASTER_ID)]).toEqual([...first.secret(ONLINE_MASTER_ID)]);
    } finally {
      store.close();
    }
  });

  /** A process that takes the keystore's lock, says so on stdout, then holds it until killed or `holdMs`. */
  const lockHolder = (holdMs: number) =>
    Bun.spawn(
      [
        process.execPath,
        "-e",
        `const { Database } = require("bun:sqlite");
         const db = new Database(${JSON.stringify(`${path}.lock`)}, { create: true });
         db.run("PRAGMA journal_mode = MEMORY");
         db.run("BEGIN EXCLUSIVE");
         console.log("held");
         // The timer holds the connection: a collected one would close and let go of the lock.
         setTimeout(() => {
           require("node:fs").writeFileSync(${JSON.stringify(`${path}.released`)}, "");
           db.close();
           process.exit(0);
         }, ${holdMs});`,
      ],
      { stdout: "pipe" },
    );
  const untilHeld = async (holder: ReturnType<typeof lockHolder>) => {
    const reader = holder.stdout.getReader();
    expect(new TextDecoder().decode((await reader.read()).value)).toContain("held");
    reader.releaseLock();
  };

  test("the lock of a process killed while holding it is gone with the process: the next write goes ahead", async () => {
    const keystore = Keystore.create(path, PASSPHRASE, FAST);
    const holder = lockHolder(60_000);
    await untilHeld(holder);
    holder.kill("SIGKILL");
    await holder.exited;
    keystore.add([entryNamed("after-crash")]);
    expect(Keystore.open(path, PASSPHRASE).has("after-crash")).toBe(true);
  });

  test("a lock held by a live process is waited for, not taken over", async () => {
    const keystore = Keystore.create(path, PASSPHRASE, FAST);
    const holder = lockHolder(300);
    try {
      await untilHeld(holder);
      keystore.add([entryNamed("after-wait")]);
      // The holder marks its letting go just before it does: the write came after.
      expect(existsSync(`${path}.released`)).toBe(true);
      expect(Keystore.open(path, PASSPHRASE).has("after-wait")).toBe(true);
    } finally {
      holder.kill();
    }
  });

  test("a lock held past the wait refuses the write as locked and changes nothing", async () => {
    const keystore = Keystore.create(path, PASSPHRASE, FAST);
    const before = readFileSync(path, "utf8");
    const holder = lockHolder(60_000);
    try {
      await untilHeld(holder);
      expect(() => keystore.add([entryNamed("while-held")])).toThrow(/locked by another process/);
      expect(readFileSync(path, "utf8")).toBe(before);
    } finally {
      holder.kill();
    }
  });

  test("a lock file an older version left (a pid in text) is replaced, not taken for a database", () => {
    const keystore = Keystore.create(path, PASSPHRASE, FAST);
    writeFileSync(`${path}.lock`, "12345");
    keystore.add([entryNamed("after-old-lock")]);
    expect(Keystore.open(path, PASSPHRASE).has("after-old-lock")).toBe(true);
  });

  test("refresh picks up an entry another process added, and refuses a tampered file", () => {
    const server = Keystore.create(path, PASSPHRASE, FAST);
    Keystore.open(path, PASSPHRASE).add([entryNamed("rotated")]);
    expect(server.has("rotated")).toBe(false);
    server.refresh();
    expect(server.has("rotated")).toBe(true);
    const doc = readDoc();
    doc.entries[0].ciphertext = flipChar(doc.entries[0].ciphertext);
    writeDoc(doc);
    expect(reasonOf(() => server.refresh())).toBe("tampered");
  });
});

describe("removing entries (a compromised sealing key)", () => {
  const sealing = (id: string) => ({
    metadata: {
      id,
      kind: "sealing_key" as const,
      environment: "live" as const,
      alg: "p256",
      created_at: "2026-01-01T00:00:00.000Z",
    },
    secret: new Uint8Array([4, 5, 6]),
  });

  test("a removed entry is gone from the file and the open keystore; the others open as before", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    store.add([sealing("product-sealing:a"), sealing("product-sealing:b")]);
    expect(store.remove(["product-sealing:a"])).toEqual(["product-sealing:a"]);
    expect(store.has("product-sealing:a")).toBe(false);
    const reopened = Keystore.open(path, PASSPHRASE);
    expect(reopened.entries().map((e) => e.id)).toEqual([
      "data-key",
      "root-live",
      "root-test",
      "product-sealing:b",
    ]);
    expect([...reopened.secret("product-sealing:b")]).toEqual([4, 5, 6]);
    expect(readFileSync(path, "utf8")).not.toContain("product-sealing:a");
    expect(readdirSync(dir).sort()).toEqual(["keystore.json", "keystore.json.lock"]);
  });

  test("removing what is not there changes nothing, so repeating an interrupted removal is safe", () => {
    const store = Keystore.create(path, PASSPHRASE, FAST);
    const before = readFileSync(path, "utf8");
    expect(store.remove(["product-sealing:missing"])).toEqual([]);
    expect(readFileSync(path, "utf8")).toBe(before);
  });

  test("another process's stale copy that adds afterwards does not bring a removed entry back", () => {
    const server = Keystore.create(path, PASSPHRASE, FAST);
    server.add([sealing("product-sealing:leaked")]);
    const cli = Keystore.open(path, PASSPHRASE);
    cli.remove(["product-sealing:leaked"]);
    // The server still holds it in memory until it re-reads the file; its next add starts from the file.
    expect(server.has("product-sealing:leaked")).toBe(true);
    server.add([sealing("product-sealing:new")]);
    expect(server.has("product-sealing:leaked")).toBe(false);
    const reopened = Keystore.open(path, PASSPHRASE);
    expect(reopened.has("product-sealing:leaked")).toBe(false);
    expect(reopened.has("product-sealing:new")).toBe(true);
  });

  test("a removal from a stale copy keeps what another process added since that copy was read", () => {
    const cli = Keystore.create(path, PASSPHRASE, FAST);
    cli.add([sealing("product-sealing:leaked")]);
    // The server adds a key (a product's signing key, another product's sealing key) after the
    // command read the file; the command's removal must write the file as it is now, not its copy.
    const server = Keystore.open(path, PASSPHRASE);
    server.add([sealing("product-sealing:added-meanwhile")]);
    expect(cli.remove(["product-sealing:leaked"])).toEqual(["product-sealing:leaked"]);
    const reopened = Keystore.open(path, PASSPHRASE);
    expect(reopened.has("product-sealing:added-meanwhile")).toBe(true);
    expect(reopened.has("product-sealing:leaked")).toBe(false);
  });
});
