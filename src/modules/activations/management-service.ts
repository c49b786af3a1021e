import { and, desc, eq, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatchWithoutEtag, type IfMatch } from "../../http/preconditions.ts";
import { activations, policies } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { LicenseService } from "../licenses/service.ts";
import type { ActivationRow, ActivationService } from "./service.ts";

/** Heartbeats come within ±10 % of the interval (the jitter `next_heartbeat_in` carries). */
const JITTER = 0.1;

export function presentActivation(row: ActivationRow) {
  return {
    id: row.id,
    license_id: row.licenseId,
    product_id: row.productId,
    status: row.status,
    machine: { info: row.machineInfo, info_digest: row.machineInfoDigest, signals: row.machineSignals },
    device_signing_key_thumbprint: row.deviceThumbprint,
    first_seen_at: row.activatedAt.toISOString(),
    last_seen_at: row.lastSeenAt.toISOString(),
    deactivated_at: row.deactivatedAt?.toISOString() ?? null,
    deactivation_reason: row.deactivationReason,
  };
}

/** The vendor's view of devices: list per license, check-in state, and forced deactivation. */
export class ActivationManagementService {
  constructor(
    private readonly deps: Deps,
    private readonly licenses: LicenseService,
    private readonly runtime: ActivationService,
  ) {}

  listForLicense(licenseId: string, environment: Environment, page: PageRequest): ActivationRow[] {
    this.licenses.get(licenseId, environment);
    return this.deps.db
      .select()
      .from(activations)
      .where(
        and(eq(activations.licenseId, licenseId), page.before ? lt(activations.id, page.before) : undefined),
      )
      .orderBy(desc(activations.id))
      .limit(page.limit + 1)
      .all();
  }

  get(id: string, environment: Environment): ActivationRow {
    const row = this.deps.db.select().from(activations).where(eq(activations.id, id)).get();
    if (!row || row.environment !== environment) throw ApiError.notFound("activation");
    return row;
  }

  detail(row: ActivationRow) {
    const now = this.deps.clock.now().getTime();
    const license = this.licenses.get(row.licenseId, row.environment);
    const policy = this.deps.db.select().from(policies).where(eq(policies.id, license.policyId)).get();
    const interval = policy?.heartbeatSec ?? 0;
    const last = (row.lastHeartbeatAt ?? row.activatedAt).getTime();
    const latest = last + interval * (1 + JITTER) * 1000;
    return {
      ...presentActivation(row),
      activated_at: row.activatedAt.toISOString(),
      last_heartbeat_at: row.lastHeartbeatAt?.toISOString() ?? null,
      heartbeat_interval_sec: interval,
      next_heartbeat_due: {
        earliest: new Date(last + interval * (1 - JITTER) * 1000).toISOString(),
        latest: new Date(latest).toISOString(),
      },
      heartbeat_overdue: row.status === "active" && now > latest,
      certificate_expires_at: row.certificateExpiresAt.toISOString(),
      app_version: row.appVersion,
      sdk_version: row.sdkVersion,
    };
  }

  /** Frees the slot and the activation's seats; the device hears ACTIVATION_DEACTIVATED next time. */
  forceDeactivate(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    const row = this.get(id, ctx.environment);
    assertIfMatchWithoutEtag(ifMatch);
    if (row.status === "deactivated") return;
    this.deps.db.transaction((tx) => {
      this.runtime.end(id, "vendor", this.deps.clock.now(), tx);
      recordAudit(tx, this.deps, ctx, {
        type: "activation.deactivated",
        target: { type: "activation", id },
        data: { license_id: row.licenseId },
      });
    });
  }
}
