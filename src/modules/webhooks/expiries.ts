import type { Database } from "bun:sqlite";
import type { Environment } from "../../domain/scopes.ts";
import { type EnqueueDeps, enqueueEvent, hasSubscriber } from "./enqueue.ts";

/**
 * license.expired and lease.expired: nothing writes when a license or a lease runs out (their
 * state is derived from `expires_at`), so the dispatcher scans for expiries that passed since the
 * last scan. The mark is stored, so expiries during a downtime are announced after the restart;
 * the first scan starts at "now" and announces nothing from before webhooks existed. A scan runs
 * only while some endpoint is subscribed; otherwise the mark just moves forward. A license whose
 * expiry was set at or after the moment it took effect (a cancellation ending it at once) is not
 * announced here: the change that ended it has its own `license.expired` audit event.
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

/** Announces expiries in (last mark, now]; returns how many events were queued. */
export function announceExpiries(deps: EnqueueDeps): number {
  const { sqlite } = deps;
  const now = deps.clock.now().getTime();
  let queued = 0;
  sqlite.transaction(() => {
    const licenseMark = mark(sqlite, "license.expired");
    if (licenseMark !== null && licenseMark < now && hasSubscriber(sqlite, "license.expired")) {
      const rows = sqlite
        .query<ExpiredLicense, [number, number]>(
          `SELECT id, environment, product_id, customer_id, expires_at FROM licenses
           WHERE status != 'revoked' AND expires_at > ? AND expires_at <= ? AND updated_at < expires_at
           ORDER BY expires_at`,
        )
        .all(licenseMark, now);
      for (const row of rows) {
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
    setMark(sqlite, "license.expired", Math.max(now, licenseMark ?? now));

    const leaseMark = mark(sqlite, "lease.expired");
    if (leaseMark !== null && leaseMark < now && hasSubscriber(sqlite, "lease.expired")) {
      const rows = sqlite
        .query<ExpiredLease, [number, number]>(
          `SELECT l.id, l.license_id, l.activation_id, a.environment, a.product_id, l.expires_at
           FROM leases l JOIN activations a ON a.id = l.activation_id
           WHERE l.status = 'active' AND l.expires_at > ? AND l.expires_at <= ? ORDER BY l.expires_at`,
        )
        .all(leaseMark, now);
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
    }
    setMark(sqlite, "lease.expired", Math.max(now, leaseMark ?? now));
  })();
  return queued;
}
