import type { Database } from "bun:sqlite";
import type { Environment } from "../../domain/scopes.ts";
import { type EnqueueDeps, enqueueEvent, hasSubscriber } from "./enqueue.ts";

/**
 * license.expired and lease.expired: nothing writes when a license or a lease runs out (their
 * state is derived from `expires_at`), so the dispatcher scans for expiries that passed since the
 * last scan. The mark is stored, so expiries during a downtime are announced after the restart;
 * the first scan starts at "now" and announces nothing from before webhooks existed. A scan runs
 * only while some endpoint is subscribed; otherwise the mark just moves forward. Each license
 * records the `expires_at` whose passing was announced (`expiry_announced`), in the same
 * transaction as the event: the scan skips a license whose current expiry is the one recorded. A
 * change that ended a license at once (a billing cancellation) records it too, as its own
 * `license.expired` audit event announced it. Any other change to the row after its expiry
 * (metadata, suspension) leaves the record alone, so it cannot hide the expiry from the scan; an
 * expiry moved later is a new value and is announced again when it passes.
 *
 * Licenses are found through their `expires_at` index. Leases have none on purpose: every lease
 * heartbeat moves `expires_at`, and a third index moving with it cost a lease renewal 31-61 µs
 * more (+22-45%, docs/performance.md), paid whether or not anyone subscribes. So the lease scan
 * reads the whole table (finished leases stay 7 days, leases/retention.ts), and at a million rows
 * that took 60-80 ms on the request thread. It therefore walks the table by rowid in chunks
 * of `leaseScanChunk` rows, one chunk per call: the dispatcher calls again on the next turn of the
 * event loop while `more` is true, so no call holds the thread for more than a few milliseconds.
 * The scan's window end and its position are stored with each chunk's events, in the same
 * transaction, so a restart part-way resumes it and announces nothing twice. A lease that expired
 * within the window cannot be renewed afterwards; it can still be released, by its device's
 * deactivation or culling, before its chunk is read, so the scan takes a lease that was active or
 * released only after it expired: the window read chunk by chunk is the one a single read would
 * have seen (and one released after it lapsed, which a single read 30 s later missed, is announced
 * too). Events come in expiry order within a chunk, in table order across chunks. An endpoint
 * that subscribes while a scan runs gets the expiries of the chunks still to come.
 */
interface ExpiredLicense {
  id: string;
  environment: Environment;
  product_id: string;
  customer_id: string | null;
  expires_at: number;
}

interface ExpiredLease {
  id: string;
  license_id: string;
  activation_id: string;
  environment: Environment;
  product_id: string;
  expires_at: number;
}

function mark(sqlite: Database, name: string): number | null {
  return (
    sqlite.query<{ value: number }, [string]>("SELECT value FROM webhook_marks WHERE name = ?").get(name)
      ?.value ?? null
  );
}

function setMark(sqlite: Database, name: string, value: number): void {
  sqlite
    .query<unknown, [string, number]>(
      "INSERT INTO webhook_marks (name, value) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
    )
    .run(name, value);
}

/**
 * Every lease expiry at or before this moment has been announced, or never will be (the first
 * scan starts at its own "now"); null: no scan has run, so none before the first one will be. A
 * scan under way moves it only when done. The lease purge (leases/retention.ts) deletes no lease
 * that expired after it, so a scan never misses a lease the purge took.
 */
export function leaseExpiriesSettledThrough(sqlite: Database): number | null {
  return mark(sqlite, "lease.expired");
}

/** Rows of the leases table read per call: 2-3.6 ms each at a million rows (docs/performance.md). */
const LEASE_SCAN_CHUNK = 20_000;

/** The stored state of a lease scan in progress (absent: none). */
const LEASE_SCAN = {
  until: "lease.expired:scan-until",
  after: "lease.expired:scan-after-rowid",
  last: "lease.expired:scan-last-rowid",
} as const;

function clearMark(sqlite: Database, name: string): void {
  sqlite.query<unknown, [string]>("DELETE FROM webhook_marks WHERE name = ?").run(name);
}

/**
 * Announces expiries in (last mark, now]: every license's, and one chunk of the lease scan.
 * `queued`: events queued by this call; `more`: the lease scan has chunks left, call again.
 */
export function announceExpiries(
  deps: EnqueueDeps,
  options: { leaseScanChunk?: number } = {},
): { queued: number; more: boolean } {
  const { sqlite } = deps;
  const now = deps.clock.now().getTime();
  let queued = 0;
  let more = false;
  sqlite
    .transaction(() => {
      queued += announceLicenses(deps, now);
      const leases = announceLeaseChunk(deps, now, options.leaseScanChunk ?? LEASE_SCAN_CHUNK);
      queued += leases.queued;
      more = leases.more;
    })
    .immediate();
  return { queued, more };
}

function announceLicenses(deps: EnqueueDeps, now: number): number {
  const { sqlite } = deps;
  let queued = 0;
  const licenseMark = mark(sqlite, "license.expired");
  if (licenseMark !== null && licenseMark < now && hasSubscriber(sqlite, "license.expired")) {
    const rows = sqlite
      .query<ExpiredLicense, [number, number]>(
        `SELECT id, environment, product_id, customer_id, expires_at FROM licenses
         WHERE status != 'revoked' AND expires_at > ? AND expires_at <= ?
           AND expiry_announced IS NOT expires_at
         ORDER BY expires_at`,
      )
      .all(licenseMark, now);
    const announced = sqlite.query<unknown, [number, string]>(
      "UPDATE licenses SET expiry_announced = ? WHERE id = ?",
    );
    for (const row of rows) {
      announced.run(row.expires_at, row.id);
      const id = enqueueEvent(deps, "license.expired", {
        environment: row.environment,
        target: { type: "license", id: row.id },
        data: {
          product_id: row.product_id,
          customer_id: row.customer_id,
          expires_at: new Date(row.expires_at).toISOString(),
        },
      });
      if (id) queued++;
    }
  }
  // Now, even when the mark is ahead: the clock stepped back (an NTP correction, a resumed VM), and
  // a mark kept ahead would never announce the expiries between now and it. A license already
  // announced is not announced again (expiry_announced).
  setMark(sqlite, "license.expired", now);
  return queued;
}

/**
 * One chunk of the lease scan: starts a scan of (mark, now] when none is under way (and someone
 * subscribes), reads the next `chunk` rowids, and on the last chunk moves the mark to the scan's
 * window end. Leases created after the scan began expire after the window (every plan's lease
 * TTL is at least 30 s) and belong to the next scan, whatever their rowid (usually past its last
 * one; a rowid the lease purge freed at the end of the table may be reused). The purge deletes no
 * lease that expired after the mark, so no row of the window goes while the scan reads it.
 */
function announceLeaseChunk(
  deps: EnqueueDeps,
  now: number,
  chunk: number,
): { queued: number; more: boolean } {
  const { sqlite } = deps;
  const leaseMark = mark(sqlite, "lease.expired");
  let until = mark(sqlite, LEASE_SCAN.until);
  if (until === null) {
    if (leaseMark === null || leaseMark >= now || !hasSubscriber(sqlite, "lease.expired")) {
      setMark(sqlite, "lease.expired", Math.max(now, leaseMark ?? now));
      return { queued: 0, more: false };
    }
    until = now;
    setMark(sqlite, LEASE_SCAN.until, until);
    setMark(sqlite, LEASE_SCAN.after, 0);
    setMark(
      sqlite,
      LEASE_SCAN.last,
      sqlite.query<{ last: number | null }, []>("SELECT max(rowid) AS last FROM leases").get()?.last ?? 0,
    );
  }
  const from = leaseMark ?? until;
  const after = mark(sqlite, LEASE_SCAN.after) ?? 0;
  const last = mark(sqlite, LEASE_SCAN.last) ?? 0;
  const through = Math.min(after + chunk, last);
  const rows = sqlite
    .query<ExpiredLease, [number, number, number, number]>(
      `SELECT l.id, l.license_id, l.activation_id, a.environment, a.product_id, l.expires_at
       FROM leases l JOIN activations a ON a.id = l.activation_id
       WHERE l.rowid > ?1 AND l.rowid <= ?2 AND l.expires_at > ?3 AND l.expires_at <= ?4
         AND (l.status = 'active' OR l.released_at > l.expires_at)
       ORDER BY l.expires_at`,
    )
    .all(after, through, from, until);
  let queued = 0;
  for (const row of rows) {
    const id = enqueueEvent(deps, "lease.expired", {
      environment: row.environment,
      target: { type: "lease", id: row.id },
      data: {
        license_id: row.license_id,
        activation_id: row.activation_id,
        product_id: row.product_id,
        expires_at: new Date(row.expires_at).toISOString(),
      },
    });
    if (id) queued++;
  }
  if (through < last) {
    setMark(sqlite, LEASE_SCAN.after, through);
    return { queued, more: true };
  }
  setMark(sqlite, "lease.expired", Math.max(until, leaseMark ?? until));
  for (const name of Object.values(LEASE_SCAN)) clearMark(sqlite, name);
  return { queued, more: false };
}
