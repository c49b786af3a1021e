import type { Logger } from "../http/logger.ts";
import { LeasePurgeFailed } from "../modules/leases/retention.ts";
import type { Services } from "../services.ts";
import { nextTurn } from "../store/stepped-count.ts";

export const SWEEP_INTERVAL_MS = 10 * 60 * 1000;

/**
 * Housekeeping that keeps the store small and the key material current: expired idempotency
 * records, runtime events past their 7 days, old device nonces, products whose signing keys are
 * still pending, retired keys whose retention ended, compromised sealing keys' private halves
 * that an interrupted command left in the keystore, spent or expired passkey registration
 * links, and webhook deliveries left queued on endpoints that no longer receive. Each step is
 * independent; one failing does not stop the others. Finished leases go in their own pass
 * (`sweepLeases`), and verifications in batches (`sweepVerifications`).
 */
export function sweepOnce(services: Services, logger: Logger): Record<string, number> {
  const steps: Record<string, () => number> = {
    idempotency_records: () => services.idempotency.sweep({ abandonInFlight: false }),
    runtime_events: () => services.runtimeEvents.purgeExpired(),
    device_nonces: () => services.runtimeGate.purgeNonces(),
    pending_products: () => services.trust.provisionPending(),
    retired_keys: () => services.trust.pruneExpiredKeys(),
    compromised_sealing_keys: () => services.sealedFiles.completeCompromises(),
    passkey_links: () => services.passkeys.purgeLinks(),
    orphaned_webhook_deliveries: () => services.webhookDeliveries.cancelOrphaned(),
  };
  const done: Record<string, number> = {};
  for (const [name, step] of Object.entries(steps)) {
    try {
      done[name] = step();
    } catch (error) {
      logger.log("error", "sweep step failed", { step: name, error: (error as Error).message });
    }
  }
  return done;
}

/**
 * Device nonces arrive with every device-proof call (thousands a second at load) and expire ten
 * minutes later: they are deleted in small batches four times a second, so no single delete holds
 * up the requests queued behind it. 2,000 per batch keeps up with 8,000 calls a second.
 */
export const NONCE_PURGE_INTERVAL_MS = 250;
export const NONCE_PURGE_BATCH = 2_000;

/**
 * One pass of the lease retention (modules/leases/retention.ts): finished leases past their
 * retention, a short batch per turn of the event loop, so a backlog of millions (a first start
 * after an upgrade) never holds up the requests queued behind it. Not a step of `sweepOnce`,
 * which runs each step whole on one turn; its first step waits for a turn of the loop too, so
 * starting the sweeper reads no lease before the server listens. Returns how many leases went.
 */
export async function sweepLeases(
  services: Services,
  logger: Logger,
  stopped: () => boolean = () => false,
): Promise<number> {
  try {
    const { purged, heldBackBy } = await services.leaseRetention.pass({ stopped });
    if (purged > 0) logger.log("info", "lease purge", { leases: purged });
    // Once per pass: the lease.expired scan has not finished in a retention's time (its chunks
    // fail, or it never runs), so finished leases pile up behind its mark.
    if (heldBackBy) {
      logger.log("warn", "lease purge held back by the lease.expired mark", {
        mark: heldBackBy.toISOString(),
      });
    }
    return purged;
  } catch (error) {
    // The batches before the failing one are gone: say so, so the log adds up.
    const purged = error instanceof LeasePurgeFailed ? error.purged : 0;
    logger.log("error", "lease purge failed", { error: (error as Error).message, leases: purged });
    return purged;
  }
}

/**
 * Email verifications (with their passkey approvals and named-user tokens) and trial
 * verifications older than two days: unauthenticated starts write a row each, so a backlog can
 * be large (a trial start once purged it inside its own transaction, and after a restart the
 * first one deleted everything overdue). Each is deleted in batches with a turn of the event
 * loop between, like the lease pass; one failing does not stop the other. Returns what went.
 */
export async function sweepVerifications(
  services: Services,
  logger: Logger,
  stopped: () => boolean = () => false,
): Promise<Record<string, number>> {
  const steps: Record<string, () => Promise<number>> = {
    // Two days covers the 24-hour send limits and code budget.
    email_verifications: () => services.emailVerifications.purge(undefined, stopped),
    trial_verifications: () => services.trials.purgeVerifications(undefined, stopped),
  };
  const done: Record<string, number> = {};
  for (const [name, step] of Object.entries(steps)) {
    try {
      done[name] = await step();
    } catch (error) {
      logger.log("error", "sweep step failed", { step: name, error: (error as Error).message });
    }
  }
  if (Object.values(done).some((n) => n > 0)) logger.log("info", "verification purge", done);
  return done;
}

/** Runs the sweep now and then every interval; returns the stop function. */
export function startSweeper(services: Services, logger: Logger, intervalMs = SWEEP_INTERVAL_MS): () => void {
  let stopped = false;
  let purgingLeases = false;
  let purgingVerifications = false;
  const run = () => {
    const done = sweepOnce(services, logger);
    if (Object.values(done).some((n) => n > 0)) logger.log("info", "sweep", done);
    // One lease pass at a time: a pass still going after an interval has the backlog in hand.
    if (!purgingLeases) {
      purgingLeases = true;
      void sweepLeases(services, logger, () => stopped).finally(() => {
        purgingLeases = false;
      });
    }
    if (!purgingVerifications) {
      purgingVerifications = true;
      // After a turn, as the lease pass does: starting the sweeper deletes nothing before the server listens.
      void nextTurn()
        .then(() => sweepVerifications(services, logger, () => stopped))
        .finally(() => {
          purgingVerifications = false;
        });
    }
  };
  run();
  const timer = setInterval(run, intervalMs);
  timer.unref?.();
  const purgeNonces = () => {
    try {
      services.runtimeGate.purgeNonces(NONCE_PURGE_BATCH);
    } catch (error) {
      logger.log("error", "nonce purge failed", { error: (error as Error).message });
    }
  };
  const nonceTimer = setInterval(purgeNonces, NONCE_PURGE_INTERVAL_MS);
  nonceTimer.unref?.();
  return () => {
    stopped = true;
    clearInterval(timer);
    clearInterval(nonceTimer);
  };
}
