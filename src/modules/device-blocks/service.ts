import { and, desc, eq, isNull, lt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { PageRequest } from "../../http/pagination.ts";
import { assertIfMatchWithoutEtag, type IfMatch } from "../../http/preconditions.ts";
import { deviceBlocks } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";

export type DeviceBlockRow = typeof deviceBlocks.$inferSelect;

export function presentDeviceBlock(row: DeviceBlockRow) {
  return {
    id: row.id,
    kind: row.kind,
    device_signing_key_thumbprint: row.kind === "device_key" ? row.target : null,
    license_id: row.kind === "license" ? row.target : null,
    reason: row.reason,
    created_at: row.createdAt.toISOString(),
  };
}

/** The vendor's device-risk policy: device keys and licenses refused at the runtime API (403). */
export class DeviceBlockService {
  private readonly lookup;
  private readonly lookupBoth;

  constructor(private readonly deps: Deps) {
    this.lookup = deps.sqlite.prepare<{ one: number }, [string, string, string]>(
      "SELECT 1 AS one FROM device_blocks WHERE environment = ? AND kind = ? AND target = ? AND removed_at IS NULL",
    );
    this.lookupBoth = deps.sqlite.prepare<{ kind: string }, [string, string, string]>(
      // Two point lookups in the index of blocks in force, not a walk through the environment's.
      `SELECT kind FROM device_blocks
       WHERE (environment = ?1 AND kind = 'license' AND target = ?2 AND removed_at IS NULL)
          OR (environment = ?1 AND kind = 'device_key' AND target = ?3 AND removed_at IS NULL)`,
    );
  }

  isBlocked(environment: Environment, kind: "device_key" | "license", target: string): boolean {
    return this.lookup.get(environment, kind, target) !== null;
  }

  /** Both blocks a runtime call can meet, in one read (every runtime call asks for both). */
  blocksOn(environment: Environment, licenseId: string, deviceThumbprint: string) {
    const kinds = this.lookupBoth.all(environment, licenseId, deviceThumbprint).map((row) => row.kind);
    return { license: kinds.includes("license"), device: kinds.includes("device_key") };
  }

  /** The blocks in force; lifted ones are kept only so that lifting them again is harmless. */
  list(environment: Environment, page: PageRequest): DeviceBlockRow[] {
    return this.deps.db
      .select()
      .from(deviceBlocks)
      .where(
        and(
          eq(deviceBlocks.environment, environment),
          isNull(deviceBlocks.removedAt),
          page.before ? lt(deviceBlocks.id, page.before) : undefined,
        ),
      )
      .orderBy(desc(deviceBlocks.id))
      .limit(page.limit + 1)
      .all();
  }

  /** Blocking the same target twice returns the existing block. */
  create(
    input: { kind: "device_key" | "license"; target: string; reason: string | null },
    ctx: ChangeContext,
  ): DeviceBlockRow {
    return this.deps.db.transaction((tx) => {
      const existing = tx
        .select()
        .from(deviceBlocks)
        .where(
          and(
            eq(deviceBlocks.environment, ctx.environment),
            eq(deviceBlocks.kind, input.kind),
            eq(deviceBlocks.target, input.target),
            isNull(deviceBlocks.removedAt),
          ),
        )
        .get();
      if (existing) return existing;
      const now = this.deps.clock.now();
      const row: DeviceBlockRow = {
        id: this.deps.ids.next("block", now.getTime()),
        environment: ctx.environment,
        kind: input.kind,
        target: input.target,
        reason: input.reason,
        createdAt: now,
        removedAt: null,
      };
      tx.insert(deviceBlocks).values(row).run();
      recordAudit(tx, this.deps, ctx, {
        type: "device_block.created",
        target: { type: "device_block", id: row.id },
        data: { kind: row.kind, target: row.target },
      });
      return row;
    });
  }

  /**
   * Lifts a block. The row stays, marked removed, so lifting it again answers 204 and changes
   * nothing, like every other DELETE of the API; an id that never was a block is 404.
   */
  remove(id: string, ifMatch: IfMatch | undefined, ctx: ChangeContext): void {
    this.deps.db.transaction((tx) => {
      const row = tx.select().from(deviceBlocks).where(eq(deviceBlocks.id, id)).get();
      if (!row || row.environment !== ctx.environment) throw ApiError.notFound("device block");
      assertIfMatchWithoutEtag(ifMatch);
      if (row.removedAt !== null) return;
      tx.update(deviceBlocks).set({ removedAt: this.deps.clock.now() }).where(eq(deviceBlocks.id, id)).run();
      recordAudit(tx, this.deps, ctx, { type: "device_block.removed", target: { type: "device_block", id } });
    });
  }
}
