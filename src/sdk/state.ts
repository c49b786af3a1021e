/**
 * The client's persisted state, one storage entry per item under a prefix that names the
 * environment and product: `svc.v1.<environment>.<product_id>.<item>`.
 */
import { SdkError, type ServerErrorBody } from "./errors.ts";
import type { Storage } from "./storage.ts";
import { isRecord, serialized } from "./util.ts";

export interface MachineInfo {
  os: string;
  arch: string;
  [field: string]: unknown;
}

export interface StoredActivation {
  activation_id: string;
  /** `sub` of the first verified certificate. */
  license_id: string;
  machine_info: MachineInfo;
  machine_info_digest: string;
}

/** An authentic, verified license-state denial. */
export interface StoredDenial {
  code: string;
  activation_id: string;
  server_time: number;
  request_id: string;
  /** What the denial said, so an answer it overtakes fails as it did (absent in older stored denials). */
  status?: number;
  details?: Record<string, unknown>;
  server_error?: ServerErrorBody;
}

export interface StoredHeartbeat {
  license_status: string;
  next_heartbeat_in: number;
  server_time: number;
  /** Local clock (ms) when the verified answer arrived. */
  received_at_ms: number;
}

export interface StoredBundle {
  /** The `data` of the trust-bundle response exactly as received. */
  signed: unknown;
  /** Local clock (ms) when it was fetched. */
  fetched_at_ms: number;
}

export const ITEMS = [
  "device_keys",
  "activation",
  "certificate",
  "bundle",
  "bundle_sequence",
  "time_high_water",
  "local_high_water",
  "denial",
  "last_heartbeat",
  "newest_answer",
  "offline_request",
  "sealed_file_keys",
] as const;
export type Item = (typeof ITEMS)[number];

export class ClientState {
  constructor(
    private readonly storage: Storage,
    readonly prefix: string,
  ) {}

  key(item: Item): string {
    return this.prefix + item;
  }

  get(item: Item): Promise<string | undefined> {
    return this.storage.get(this.key(item));
  }

  set(item: Item, value: string): Promise<void> {
    return this.storage.set(this.key(item), value);
  }

  delete(item: Item): Promise<void> {
    return this.storage.delete(this.key(item));
  }

  async getJson<T>(item: Item): Promise<T | undefined> {
    const text = await this.get(item);
    if (text === undefined) return undefined;
    try {
      const value: unknown = JSON.parse(text);
      if (!isRecord(value)) throw new Error("not an object");
      return value as T;
    } catch (cause) {
      throw new SdkError("STORAGE_CORRUPT", `stored ${item} cannot be read`, { kind: "storage", cause });
    }
  }

  setJson(item: Item, value: object): Promise<void> {
    return this.set(item, JSON.stringify(value));
  }

  private async getInt(item: Item): Promise<number | undefined> {
    const text = await this.get(item);
    if (text === undefined) return undefined;
    const n = Number(text);
    if (!Number.isSafeInteger(n)) {
      throw new SdkError("STORAGE_CORRUPT", `stored ${item} is not an integer`, { kind: "storage" });
    }
    return n;
  }

  /** Highest trust-bundle sequence ever accepted on this device (0 when none). */
  async bundleSequence(): Promise<number> {
    return (await this.getInt("bundle_sequence")) ?? 0;
  }

  raiseBundleSequence(sequence: number): Promise<void> {
    return this.oneAtATime(async () => {
      if (sequence > (await this.bundleSequence())) await this.set("bundle_sequence", String(sequence));
    });
  }

  /**
   * The marks below only ever move one way; each change reads, compares and writes, and two calls
   * in flight (the heartbeat loop and an explicit call) must not interleave those steps, or the
   * slower one writes a lower value last.
   */
  private readonly oneAtATime = serialized();

  /** Highest verified server_time seen (unix seconds), if any. */
  timeHighWater(): Promise<number | undefined> {
    return this.getInt("time_high_water");
  }

  raiseTimeHighWater(serverTime: number): Promise<void> {
    return this.oneAtATime(async () => {
      const current = await this.timeHighWater();
      if (current === undefined || serverTime > current)
        await this.set("time_high_water", String(serverTime));
    });
  }

  /**
   * Highest local clock reading seen since the last verified server time. A clock set back while
   * offline goes behind it, even when the signed high-water is older than the jump.
   */
  localHighWater(): Promise<number | undefined> {
    return this.getInt("local_high_water");
  }

  /** Raises the local high-water, or (`reset`) sets it to a verified server time, the truth. */
  setLocalHighWater(seconds: number, options: { reset: boolean } = { reset: false }): Promise<void> {
    return this.oneAtATime(async () => {
      const current = await this.localHighWater();
      if (options.reset || current === undefined || seconds > current)
        await this.set("local_high_water", String(seconds));
    });
  }

  /**
   * Every change to the activation's records (activation, certificate, last heartbeat, denial)
   * runs inside this, one at a time. Calls that do not wait for each other (heartbeats, lease
   * calls, sealed-file key requests) each read what is stored, decide and write; interleaved, a
   * heartbeat could delete a denial recorded after it decided, or write back an activation a
   * signed 410 had just ended. Nothing inside may call it again.
   */
  activationRecords = serialized();

  /** Forgets the activation and everything tied to it; keeps keys, bundle and time high-water. */
  async clearActivation(): Promise<void> {
    await this.delete("activation");
    await this.delete("certificate");
    await this.delete("last_heartbeat");
    await this.delete("newest_answer");
  }

  /** The second the newest signed answer behind the stored activation state was signed. */
  async newestAnswer(): Promise<number | undefined> {
    const newest = await this.getInt("newest_answer");
    return newest ?? (await this.getJson<StoredHeartbeat>("last_heartbeat"))?.server_time;
  }

  /** Sets it (`reset`: a new activation starts its own history), else only ever raises it. */
  async setNewestAnswer(serverTime: number, options = { reset: false }): Promise<void> {
    const newest = options.reset ? undefined : await this.getInt("newest_answer");
    if (newest === undefined || serverTime > newest) await this.set("newest_answer", String(serverTime));
  }
}
