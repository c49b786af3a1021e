import { Database } from "bun:sqlite";
import { cpSync, mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import type { BenchRequest } from "./requests.ts";
import type { BenchServer } from "./server.ts";

/**
 * The bench's unmeasured work around the runs: reading what the server stored (straight from its
 * SQLite file, read-only) and sending requests with fetch (probes, warm-ups, top-ups).
 */

export interface StoredLease {
  id: string;
  activationId: string;
  instanceId: string;
}

/** Leases still active a minute from now, so a run can heartbeat or release them. */
export function activeLeases(dataDir: string): StoredLease[] {
  const db = new Database(join(dataDir, "licensing.db"), { readonly: true });
  try {
    return db
      .query<{ id: string; activation_id: string; instance_id: string }, [number]>(
        "SELECT id, activation_id, instance_id FROM leases WHERE status = 'active' AND expires_at > ?",
      )
      .all(Date.now() + 60_000)
      .map((row) => ({ id: row.id, activationId: row.activation_id, instanceId: row.instance_id }));
  } finally {
    db.close();
  }
}

export function countActivations(dataDir: string): number {
  const db = new Database(join(dataDir, "licensing.db"), { readonly: true });
  try {
    return db.query<{ n: number }, []>("SELECT count(*) AS n FROM activations").get()?.n ?? 0;
  } finally {
    db.close();
  }
}

/**
 * A consistent copy of a live data dir: the store through `VACUUM INTO` (the server may be
 * writing), every other file (keystore, passphrase) as it is.
 */
export function snapshotStore(dataDir: string, into: string): void {
  mkdirSync(into, { recursive: true, mode: 0o700 });
  for (const name of readdirSync(dataDir))
    if (!name.startsWith("licensing.db")) cpSync(join(dataDir, name), join(into, name), { recursive: true });
  const db = new Database(join(dataDir, "licensing.db"), { readonly: true });
  try {
    db.run("VACUUM INTO ?", [join(into, "licensing.db")]);
  } finally {
    db.close();
  }
}

/** One request that must succeed before a route is measured; returns its response's size. */
export async function probe(server: BenchServer, request: BenchRequest, what: string): Promise<number> {
  const response = await fetch(`${server.url}${request.path}`, {
    method: request.method,
    headers: request.headers,
    body: request.body === "" ? undefined : request.body,
  });
  const text = await response.text();
  if (response.status < 200 || response.status > 299) {
    throw new Error(`${what}: the probe request answered ${response.status}: ${text.slice(0, 500)}`);
  }
  return Buffer.byteLength(text);
}

/** Sends every request, `parallel` at a time, with fetch; returns the count of each status. */
export async function sendAll(
  url: string,
  requests: BenchRequest[],
  parallel = 16,
): Promise<Record<string, number>> {
  const statuses: Record<string, number> = {};
  let next = 0;
  await Promise.all(
    Array.from({ length: parallel }, async () => {
      while (next < requests.length) {
        const request = requests[next++] as BenchRequest;
        const response = await fetch(`${url}${request.path}`, {
          method: request.method,
          headers: request.headers,
          body: request.body === "" ? undefined : request.body,
        });
        await response.arrayBuffer();
        statuses[response.status] = (statuses[response.status] ?? 0) + 1;
      }
    }),
  );
  return statuses;
}
