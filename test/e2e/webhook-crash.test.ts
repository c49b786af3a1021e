import { Database } from "bun:sqlite";
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import type { Server } from "bun";
import { Webhook } from "standardwebhooks";
import {
  api,
  BUILD_TIMEOUT_MS,
  initialisedDataDir,
  removeTempDirs,
  type ServerProcess,
  startServe,
} from "./binary.ts";

/**
 * Crash safety of the webhook outbox (issue 8): `kill -9` of the executable while every
 * acknowledged write queues a webhook event, then a restart on the same data dir. Every
 * acknowledged change must be delivered after the restart (queued work resumes, at least once,
 * with a stable webhook-id), and nothing may be delivered for a change that never committed.
 */
const servers: ServerProcess[] = [];
let receiver: Server<undefined>;
let dataDir: string;
let liveKey: string;
let up = false;
const received: { id: string; body: string; headers: Record<string, string> }[] = [];

beforeAll(async () => {
  ({ dataDir, liveKey } = await initialisedDataDir());
  receiver = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch: async (request) => {
      const body = await request.text();
      const headers = Object.fromEntries(request.headers.entries());
      received.push({ id: headers["webhook-id"] ?? "", body, headers });
      // Down until the restart: every attempt before the kill fails and stays queued.
      return new Response(null, { status: up ? 204 : 503 });
    },
  });
}, BUILD_TIMEOUT_MS);

afterAll(async () => {
  for (const server of servers) if (server.proc.exitCode === null) await server.stop("SIGKILL");
  receiver.stop(true);
  removeTempDirs();
});

const ENV = { LICENSING_WEBHOOK_ALLOW_PRIVATE_NETWORKS: "true" };
const WORKERS = 4;
const ACKED_BEFORE_KILL = 40;

test("after kill -9 during webhook enqueue, every acknowledged change is delivered after the restart", async () => {
  let server = await startServe(["--data-dir", dataDir], { env: ENV });
  servers.push(server);
  const created = await api(server.url, liveKey, "POST", "/mgmt/v1/webhooks", {
    url: `http://127.0.0.1:${receiver.port}/hook`,
    events: ["customer.created"],
  });
  expect(created.status).toBe(201);
  const secret = created.body.data.secret as string;

  const acked: string[] = [];
  const sent: string[] = [];
  let killed = false;
  const worker = async (index: number) => {
    for (let n = 0; !killed; n++) {
      const name = `c-${index}-${n}`;
      sent.push(name);
      try {
        const response = await api(server.url, liveKey, "POST", "/mgmt/v1/customers", { name });
        if (response.status === 201) acked.push(response.body.data.public_id as string);
        else if (response.status !== 429) throw new Error(`unexpected ${response.status}`);
      } catch (error) {
        if (!killed) throw error;
        return;
      }
    }
  };
  const load = Promise.all(Array.from({ length: WORKERS }, (_, i) => worker(i)));
  const started = Date.now();
  while (acked.length < ACKED_BEFORE_KILL && Date.now() - started < 20_000) await Bun.sleep(5);
  killed = true;
  server.proc.kill("SIGKILL");
  await server.proc.exited;
  await load;
  expect(acked.length).toBeGreaterThanOrEqual(ACKED_BEFORE_KILL);

  // Every acknowledged change left its event in the outbox, in the same commit.
  const store = new Database(join(dataDir, "licensing.db"));
  const queued = store
    .query<{ n: number }, []>(
      "SELECT count(*) AS n FROM webhook_deliveries WHERE event_type = 'customer.created'",
    )
    .get()?.n;
  const customers = store.query<{ n: number }, []>("SELECT count(*) AS n FROM customers").get()?.n;
  store.close();
  expect(queued).toBe(customers as number);
  expect(customers).toBeGreaterThanOrEqual(acked.length);

  up = true;
  server = await startServe(["--data-dir", dataDir], { env: ENV });
  servers.push(server);
  const delivered = () =>
    new Set(
      received
        .filter((r) => r.headers["webhook-signature"] && up)
        .map((r) => JSON.parse(r.body).data.target.id as string),
    );
  // Retries are due 5 s (±10%) after the failed attempt, ones never attempted at once, and one
  // cut off mid-attempt by the kill once its claim lapses (25 s).
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline && !acked.every((id) => delivered().has(id))) await Bun.sleep(100);
  expect(acked.filter((id) => !delivered().has(id))).toEqual([]);

  // Every delivery verifies with the secret; the ids of one event are stable across attempts.
  const wh = new Webhook(secret);
  const byTarget = new Map<string, Set<string>>();
  for (const r of received) {
    const payload = wh.verify(r.body, r.headers) as { type: string; data: { target: { id: string } } };
    expect(payload.type).toBe("customer.created");
    const ids = byTarget.get(payload.data.target.id) ?? new Set();
    ids.add(r.id);
    byTarget.set(payload.data.target.id, ids);
  }
  for (const ids of byTarget.values()) expect(ids.size).toBe(1);
  // Nothing was delivered for a change that does not exist.
  const list = await api(server.url, liveKey, "GET", "/mgmt/v1/customers?limit=200");
  const existing = new Set(list.body.data.map((c: { public_id: string }) => c.public_id));
  for (const target of byTarget.keys()) expect(existing.has(target)).toBe(true);

  // Committed but unacknowledged changes (cut off by the kill) are delivered too: the queue drains.
  const logPath = `/mgmt/v1/webhooks/${created.body.data.public_id}/deliveries?limit=200`;
  const unfinished = async () =>
    (await api(server.url, liveKey, "GET", logPath)).body.data.filter(
      (d: { status: string }) => d.status !== "succeeded",
    );
  while (Date.now() < deadline && (await unfinished()).length > 0) await Bun.sleep(200);
  expect(await unfinished()).toEqual([]);
  expect(await server.stop("SIGTERM")).toBe(0);
}, 120_000);
