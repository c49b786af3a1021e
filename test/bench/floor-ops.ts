import { Database } from "bun:sqlite";
import { createHash, generateKeyPairSync, randomBytes, sign, verify } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { FloorOperation } from "./lib/floor.ts";

/**
 * The per-operation floor on one core (run pinned by run.ts): one Ed25519 verify and one sign
 * (node:crypto, keys imported once), one indexed SQLite read and one write (bun:sqlite prepared
 * statements, WAL, synchronous=NORMAL, on a file, each write its own transaction, as an
 * acknowledged request needs).
 *
 * Two more: the writes a heartbeat and an activation cannot do without, each call in its own
 * transaction like `write` (the activation's floor counts its writes; the heartbeat's are printed
 * for information, its floor keeping DESIGN §7's one write). A heartbeat: its proof's nonce under a unique key, and its activation's
 * check-in. An activation: its row under a unique (license, device) index, the Idempotency-Key
 * record with the answer it replays, and its nonce.
 *
 * Usage: bun test/bench/floor-ops.ts [ROWS]: prints one JSON object of microseconds per operation
 * (the median of three runs of each).
 * bun test/bench/floor-ops.ts --serve DIR: what `npm run bench` runs beside the server (its store
 * in DIR), for the floor slices it interleaves with each route's (this machine's speed moves within
 * a second, so a floor measured at another time than a route cannot judge it). Prints "ready";
 * then each line read from stdin, a number of milliseconds, gets one line of JSON back: every
 * operation run in turns of ROUND_MS_PER_OPERATION for about that long, as [microseconds, calls]
 * each. After each slice the rows it wrote are deleted (untimed), so every slice writes into
 * tables of the same size.
 */
const serve = process.argv[2] === "--serve";
const ROWS = serve ? 100_000 : Number(process.argv[2] ?? 100_000);
const RUN_MS = 400;
/**
 * `--serve` runs each operation this long in turn, round after round: long enough that switching
 * costs nothing (rounds of 4 ms made reads 35% and pages of 50 rows 50% slower, the caches
 * refilling after every switch; 40 ms and 125 ms measure the same), short enough that a 1 s slice
 * samples every operation three times over it.
 */
const ROUND_MS_PER_OPERATION = 40;
const REPEATS = 3;

/** Median over REPEATS runs of µs per call, each run at least RUN_MS after a warm-up. */
function measure(op: (i: number) => void): number {
  for (let i = 0; i < 2000; i++) op(i);
  const results: number[] = [];
  for (let r = 0; r < REPEATS; r++) {
    const [elapsedUs, calls] = timed(op, RUN_MS);
    results.push(elapsedUs / calls);
  }
  results.sort((a, b) => a - b);
  return results[Math.floor(REPEATS / 2)] as number;
}

let counter = 0;
/** Calls `op` in batches of four until `ms` have passed: [µs elapsed, calls]. */
function timed(op: (i: number) => void, ms: number): [number, number] {
  const batch = 4;
  let calls = 0;
  const started = performance.now();
  let elapsed = 0;
  while (elapsed < ms) {
    for (let k = 0; k < batch; k++) op(counter++);
    calls += batch;
    elapsed = performance.now() - started;
  }
  return [elapsed * 1000, calls];
}

// Crypto: a device-proof signing string (~230 bytes) and a response assertion (~400 bytes).
const device = generateKeyPairSync("ed25519");
const online = generateKeyPairSync("ed25519");
const proofMessage = Buffer.from(
  `Service-Device-Proof-v1\nPOST\n/runtime/v1/activations/act_01JZ8X5A7C9E1G3H5J7K9M1N3P/heartbeat\nact_01JZ8X5A7C9E1G3H5J7K9M1N3P\n1767315945\n${randomBytes(16).toString("base64url")}\n${createHash("sha256").update("{}").digest("hex")}`,
);
const proofSignature = sign(null, proofMessage, device.privateKey);
const assertion = Buffer.from(
  `Service-Response-v1\n{"body_sha256":"${"a".repeat(64)}","key_id":"k_75287d70be868e978c0e","nonce":"kW3nR8tZ2vQ6xB1mY5cL9dH4","parent_key_id":"k_e624138449fffda15bc1","product_id":"prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y","request_id":"req_01JZ8X5B2D4F6H8K0M2P4R6T8V","server_time":1767312345,"status":200,"v":1}`,
);

const verifyOp = () => {
  if (!verify(null, proofMessage, device.publicKey, proofSignature)) throw new Error("verify failed");
};
const signOp = () => {
  sign(null, assertion, online.privateKey);
};

// SQLite: a table shaped like activations (text primary key, ~400-byte rows), ROWS rows.
const dir = mkdtempSync(join(serve ? (process.argv[3] ?? tmpdir()) : tmpdir(), "bench-floor-"));
const db = new Database(join(dir, "floor.db"), { create: true, strict: true });
db.run("PRAGMA journal_mode = WAL");
db.run("PRAGMA synchronous = NORMAL");
db.run(`CREATE TABLE rows (
  id TEXT PRIMARY KEY NOT NULL, license_id TEXT NOT NULL, status TEXT NOT NULL, device_key TEXT NOT NULL,
  thumbprint TEXT NOT NULL, machine_info TEXT NOT NULL, digest TEXT NOT NULL, activated_at INTEGER NOT NULL,
  last_seen_at INTEGER NOT NULL, last_heartbeat_at INTEGER)`);
db.run("CREATE INDEX rows_license ON rows (license_id, status)");
db.run(
  "CREATE TABLE nonces (activation_id TEXT NOT NULL, nonce TEXT NOT NULL, seen_at INTEGER NOT NULL, PRIMARY KEY (activation_id, nonce))",
);
const ids: string[] = [];
const insertRow = db.prepare(
  "INSERT INTO rows VALUES (?, 'lic_01JZ8X4N0A1B2C3D4E5F6G7H8J', 'active', ?, ?, ?, ?, ?, ?, NULL)",
);
db.transaction(() => {
  for (let i = 0; i < ROWS; i++) {
    const id = `act_${String(i).padStart(26, "0")}`;
    ids.push(id);
    const key = `ed25519:${randomBytes(32).toString("base64url")}`;
    insertRow.run(
      id,
      key,
      createHash("sha256").update(key).digest("hex"),
      '{"os":"linux","arch":"x64","os_version":"6.1","cpu_cores":8}',
      "f".repeat(64),
      Date.now(),
      Date.now(),
    );
  }
})();
db.run("PRAGMA wal_checkpoint(TRUNCATE)");
const pick = (i: number) => ids[(i * 7919) % ROWS] as string;

const read = db.prepare("SELECT * FROM rows WHERE id = ?");
const readOp = (i: number) => {
  if (!read.get(pick(i))) throw new Error("row not found");
};
const update = db.prepare("UPDATE rows SET last_heartbeat_at = ?, last_seen_at = ? WHERE id = ?");
const writeOp = (i: number) => {
  update.run(i, i, pick(i));
};
const insertNonce = db.prepare("INSERT INTO nonces (activation_id, nonce, seen_at) VALUES (?, ?, ?)");
const appendOp = (i: number) => {
  insertNonce.run(pick(i), `n${i}-${randomBytes(8).toString("hex")}`, i);
};
const page = db.prepare("SELECT * FROM rows WHERE id < ? ORDER BY id DESC LIMIT 50");
const pageOp = (i: number) => {
  page.all(pick(i + ROWS / 2));
};

// A heartbeat's writes: its proof's nonce, and its activation's check-in.
const heartbeatWrites = db.transaction((i: number) => {
  insertNonce.run(pick(i), `h${i}-${randomBytes(8).toString("hex")}`, i);
  update.run(i, i, pick(i));
});
const heartbeatWriteOp = (i: number) => heartbeatWrites.immediate(i);

// An activation's writes, with only the indexes the spec's rules need (one binding per device and
// license, one answer per Idempotency-Key, one use per nonce), over tables that already hold the
// 10k activations of the bench's license and their records.
db.run(`CREATE TABLE activations (
  id TEXT PRIMARY KEY NOT NULL, license_id TEXT NOT NULL, status TEXT NOT NULL, device_key TEXT NOT NULL,
  kem_key TEXT NOT NULL, thumbprint TEXT NOT NULL, machine_info TEXT NOT NULL, digest TEXT NOT NULL,
  activated_at INTEGER NOT NULL, last_seen_at INTEGER NOT NULL)`);
db.run("CREATE UNIQUE INDEX activations_device ON activations (license_id, thumbprint)");
db.run(`CREATE TABLE idempotency (scope TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL,
  answer TEXT NOT NULL, expires_at INTEGER NOT NULL, PRIMARY KEY (scope, key))`);
const insertActivation = db.prepare(
  "INSERT INTO activations VALUES (?, 'lic_01JZ8X4N0A1B2C3D4E5F6G7H8J', 'active', ?, ?, ?, ?, ?, ?, ?)",
);
const insertRecord = db.prepare("INSERT INTO idempotency VALUES (?, ?, ?, ?, ?)");
// What an activation's record keeps to replay: its id, its certificate (a signed JWS), a digest.
const answer = randomBytes(1200).toString("base64url");
// Every activation's random values are drawn before anything is timed, so the loop below costs
// the three inserts and nothing else (this floor is the activation target's). Random, not
// sequential, because real keys land on random leaves of each unique index. `--serve` deletes
// what each slice wrote and draws from the start of the pool again.
const ACTIVATION_POOL = 100_000;
const drawActivation = () => {
  const bytes = randomBytes(32 + 65 + 32 + 18 + 16);
  return {
    deviceKey: `ed25519:${bytes.subarray(0, 32).toString("base64url")}`,
    kemKey: `p256:${bytes.subarray(32, 97).toString("base64url")}`,
    thumbprint: bytes.subarray(97, 129).toString("hex"),
    idempotencyKey: bytes.subarray(129, 147).toString("base64url"),
    nonce: bytes.subarray(147, 163).toString("base64url"),
  };
};
const pool = Array.from({ length: ACTIVATION_POOL }, drawActivation);
let drawn = 0;
let activations = 0;
const activationWrites = db.transaction(() => {
  const next = pool[drawn++];
  if (!next) throw new Error(`floor-ops: more than ${ACTIVATION_POOL} activations measured at once`);
  const now = Date.now();
  insertActivation.run(
    `act_${String(activations++).padStart(26, "0")}`,
    next.deviceKey,
    next.kemKey,
    next.thumbprint,
    '{"os":"linux","arch":"x64","os_version":"6.1","cpu_cores":8,"hostname":"build-agent-17"}',
    "f".repeat(64),
    now,
    now,
  );
  const scope = `device:${next.thumbprint}`;
  insertRecord.run(scope, next.idempotencyKey, "e".repeat(64), answer, now);
  insertNonce.run(scope, next.nonce, now);
});
db.transaction(() => {
  for (let i = 0; i < 10_000; i++) activationWrites();
})();
db.run("PRAGMA wal_checkpoint(TRUNCATE)");
const activationWriteOp = () => activationWrites.immediate();

/** Every operation, under the name run.ts reads it by (µs per call). */
const operations: Record<FloorOperation, (i: number) => void> = {
  verify_us: verifyOp,
  sign_us: signOp,
  read_us: readOp,
  write_us: writeOp,
  append_us: appendOp,
  page50_us: pageOp,
  heartbeat_write_us: heartbeatWriteOp,
  activation_write_us: activationWriteOp,
};

if (serve) {
  for (const op of Object.values(operations)) timed(op, 50);
  // What a slice writes is deleted after it: the tables stay as the floor describes them.
  const baseline = (table: string) =>
    (db.query(`SELECT coalesce(max(rowid), 0) AS top FROM ${table}`).get() as { top: number }).top;
  const tables = ["nonces", "activations", "idempotency"].map((table) => ({
    table,
    deleteAbove: db.prepare(`DELETE FROM ${table} WHERE rowid > ?`),
    top: baseline(table),
  }));
  const drawnBefore = drawn;
  const names = Object.keys(operations);
  console.log("ready");
  for await (const line of console) {
    const ms = Number(line);
    if (!(ms > 0)) break;
    // Round after round of each operation, so that each one samples the machine's speed across
    // the whole slice (it moves within a second), not one stretch of it.
    const rounds = Math.max(1, Math.round(ms / (ROUND_MS_PER_OPERATION * names.length)));
    const slice = Object.fromEntries(names.map((name) => [name, [0, 0]])) as Record<string, [number, number]>;
    for (let round = 0; round < rounds; round++) {
      for (const [name, op] of Object.entries(operations)) {
        const [us, calls] = timed(op, ROUND_MS_PER_OPERATION);
        const total = slice[name] as [number, number];
        total[0] += us;
        total[1] += calls;
      }
    }
    db.transaction(() => {
      for (const { deleteAbove, top } of tables) deleteAbove.run(top);
    })();
    // The deleted activations' values can be drawn again.
    drawn = drawnBefore;
    console.log(JSON.stringify(slice));
  }
} else {
  const result: Record<string, number> = {};
  for (const [name, op] of Object.entries(operations)) result[name] = measure(op);
  console.log(JSON.stringify({ ...result, rows: ROWS }));
}
db.close();
rmSync(dir, { recursive: true, force: true });
