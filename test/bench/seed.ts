import { Database } from "bun:sqlite";
import { writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { IdGenerator } from "../../src/domain/ids.ts";
import { MACHINE_DIGEST, MACHINE_INFO } from "./lib/requests.ts";
import type { KeyBatch } from "./seed-worker.ts";

/**
 * Seeds ROWS activations straight into a stopped server's store, with real device keys made by
 * worker threads (seed-worker.ts) while this thread inserts, in batched transactions. Rows are
 * spread round-robin over the product's licenses, with ids in the server's format and time order,
 * and the same columns an activation over HTTP writes. Writes SAMPLE "activation_id seed" lines to
 * SAMPLE_FILE (evenly spread over the rows) so the bench can sign heartbeats as those devices.
 *
 * Usage: bun test/bench/seed.ts STORE PRODUCT_ID ROWS SAMPLE SAMPLE_FILE
 * Prints one JSON line: rows, seconds spent, and the key-generation and insert split.
 */
const [store = "", productId = "", rowsText = "", sampleText = "", sampleFile = ""] = process.argv.slice(2);
const ROWS = Number(rowsText);
const SAMPLE = Number(sampleText);
const BATCH = 10_000;
const started = performance.now();

const db = new Database(store, { strict: true });
db.run("PRAGMA journal_mode = WAL");
db.run("PRAGMA synchronous = NORMAL");
db.run("PRAGMA busy_timeout = 5000");
db.run("PRAGMA cache_size = -262144");
const product = db
  .query<{ environment: string }, [string]>("SELECT environment FROM products WHERE id = ?")
  .get(productId);
if (!product) throw new Error(`no product ${productId} in ${store}`);
const licenseIds = db
  .query<{ id: string }, [string]>("SELECT id FROM licenses WHERE product_id = ? ORDER BY id")
  .all(productId)
  .map((row) => row.id);
if (licenseIds.length === 0) throw new Error("the product has no license");

const insert = db.prepare(
  `INSERT INTO activations (id, environment, product_id, license_id, status, device_signing_key,
     device_thumbprint, device_kem_key, machine_info, machine_info_digest, machine_baseline_at,
     machine_signals, app_version, sdk_version, activated_at, last_seen_at, last_heartbeat_at,
     certificate_expires_at)
   VALUES (?, ?, ?, ?, 'active', ?, ?, ?, ?, ?, ?, ?, '1.0.0', 'bench-seed', ?, ?, NULL, ?)`,
);
const machineInfo = JSON.stringify(MACHINE_INFO);
const signals = JSON.stringify({ hostname: "seeded" });
const ids = new IdGenerator();

const workers = Array.from(
  { length: Math.max(1, availableParallelism()) },
  () => new Worker(new URL("./seed-worker.ts", import.meta.url).href),
);
const generate = (worker: Worker, count: number) =>
  new Promise<KeyBatch>((resolve) => {
    worker.onmessage = (event: MessageEvent<KeyBatch>) => resolve(event.data);
    worker.postMessage({ count });
  });

const sampleEvery = Math.max(1, Math.floor(ROWS / Math.max(1, SAMPLE)));
const sample: string[] = [];
let inserted = 0;
let insertMs = 0;
let waitMs = 0;
// Each worker always has a batch in the making while this thread inserts the previous one.
const batches = Math.ceil(ROWS / BATCH);
const pending: Promise<KeyBatch>[] = [];
let requested = 0;
const request = () => {
  if (requested >= batches) return;
  const worker = workers[requested % workers.length] as Worker;
  const count = Math.min(BATCH, ROWS - requested * BATCH);
  // A worker answers its batches in order, one message at a time.
  const previous = pending[requested - workers.length] ?? Promise.resolve(undefined);
  pending.push(previous.then(() => generate(worker, count)));
  requested++;
};
for (let i = 0; i < workers.length * 2; i++) request();

for (let b = 0; b < batches; b++) {
  const waitStart = performance.now();
  const batch = await (pending[b] as Promise<KeyBatch>);
  waitMs += performance.now() - waitStart;
  request();
  const insertStart = performance.now();
  const now = Date.now();
  db.transaction(() => {
    for (let i = 0; i < batch.signing.length; i++) {
      const id = ids.next("activation", now);
      const row = inserted + i;
      insert.run(
        id,
        product.environment,
        productId,
        licenseIds[row % licenseIds.length] as string,
        batch.signing[i] as string,
        batch.thumbprints[i] as string,
        batch.kem[i] as string,
        machineInfo,
        MACHINE_DIGEST,
        now,
        signals,
        now,
        now,
        now + 7 * 86_400_000,
      );
      if (row % sampleEvery === 0 && sample.length < SAMPLE) {
        sample.push(`${id} ${Buffer.from(batch.seeds.subarray(i * 32, i * 32 + 32)).toString("base64url")}`);
      }
    }
  })();
  inserted += batch.signing.length;
  insertMs += performance.now() - insertStart;
}
const checkpointStart = performance.now();
db.run("PRAGMA wal_checkpoint(TRUNCATE)");
const checkpointMs = performance.now() - checkpointStart;
db.close();
for (const worker of workers) worker.terminate();
writeFileSync(sampleFile, `${sample.join("\n")}\n`);
console.log(
  JSON.stringify({
    rows: inserted,
    licenses: licenseIds.length,
    seconds: (performance.now() - started) / 1000,
    insert_seconds: insertMs / 1000,
    waiting_for_keys_seconds: waitMs / 1000,
    checkpoint_seconds: checkpointMs / 1000,
    workers: workers.length,
    sample: sample.length,
  }),
);
