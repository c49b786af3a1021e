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
  /** The activation it answered; "" for a refused activation request (there was none yet). */
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
  /** Local clock (ms) when it was fetched (or taken from an offline package). */
  fetched_at_ms: number;
  /**
   * When the service last confirmed the bundle held (ms; a successful refetch, read on the local
   * clock but never behind the stored time marks): signed online answers are verified with it
   * only for a while after (trust.ts). Absent in bundles stored by older SDKs, and after an
   * offline package's bundle was taken on a device that never fetched one: never confirmed.
   */
  confirmed_at_ms?: number;
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
  "ended_activations",
  "replaced_activations",
  "license_denials",
  "offline_request",
  "sealed_file_keys",
] as const;
export type Item = (typeof ITEMS)[number];

/** How many ended activations are remembered: far more than one device goes through. */
const MAX_ENDED_ACTIVATIONS = 32;
/** How many replaced activations are remembered, for the same reason. */
const MAX_REPLACED_ACTIVATIONS = 32;

/** How many licenses' denials are remembered: a device goes through a few licenses at most. */
const MAX_LICENSE_DENIALS = 32;

/** An activation a newer offline package replaced on this device, and that package's issued_at. */
interface ReplacedActivation {
  activation_id: string;
  replaced_at: number;
}

/** A license's latest signed license-state denial, whichever of its activations it named. */
interface LicenseDenial {
  license_id: string;
  denial: StoredDenial;
}

/** The fields the decisions read: a denial lacking them cannot be placed in time. */
function isStoredDenial(value: unknown): value is StoredDenial {
  return (
    isRecord(value) &&
    typeof value.code === "string" &&
    typeof value.activation_id === "string" &&
    Number.isSafeInteger(value.server_time)
  );
}

export class ClientState {
  constructor(
    private readonly storage: Storage,
    readonly prefix: string,
  ) {}

  key(item: Item): string {
    return this.prefix + item;
  }

  get(item: Item): Promise<string | undefined> {
    return this.storageCall("read", item, () => this.storage.get(this.key(item)));
  }

  set(item: Item, value: string): Promise<void> {
    return this.storageCall("write", item, () => this.storage.set(this.key(item), value));
  }

  delete(item: Item): Promise<void> {
    return this.storageCall("delete", item, () => this.storage.delete(this.key(item)));
  }

  /** The app's adapter may throw anything (a full quota, a locked file): callers get an SdkError. */
  private async storageCall<T>(verb: string, item: Item, call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (cause) {
      if (cause instanceof SdkError) throw cause;
      throw new SdkError("STORAGE_UNAVAILABLE", `storage could not ${verb} ${item}`, {
        kind: "storage",
        cause,
      });
    }
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

  /**
   * The item, or undefined when it is absent or cannot be read (the same as absent, see getMark).
   * Only corruption is forgiven: a storage adapter that fails still throws STORAGE_UNAVAILABLE,
   * since taking a read that failed for "none" would let a locked file lift what it holds.
   */
  async getJsonOrNone<T>(item: Item): Promise<T | undefined> {
    try {
      return await this.getJson<T>(item);
    } catch (error) {
      if (error instanceof SdkError && error.code === "STORAGE_CORRUPT") return undefined;
      throw error;
    }
  }

  setJson(item: Item, value: object): Promise<void> {
    return this.set(item, JSON.stringify(value));
  }

  /**
   * A mark (a sequence, a time, in decimal digits), or undefined when there is none or it cannot
   * be read. An unreadable mark counts as none: deleting it would have the same effect, so
   * refusing to go on protects nothing, and it would stop the client for good, since the verified
   * value that replaces it could never be written.
   */
  private async getMark(item: Item): Promise<number | undefined> {
    const text = await this.get(item);
    if (text === undefined || !/^(?:0|[1-9][0-9]{0,15})$/.test(text)) return undefined;
    const n = Number(text);
    return Number.isSafeInteger(n) ? n : undefined;
  }

  /**
   * The stored denial for decisions that write (a heartbeat, a package, another denial): one that
   * cannot be read counts as none, for the reason above, so the next verified answer replaces it.
   * licenseInfo() reads it strictly and reports STORAGE_CORRUPT until then.
   */
  async denialForUpdate(): Promise<StoredDenial | undefined> {
    const denial = await this.getJsonOrNone<StoredDenial>("denial");
    return isStoredDenial(denial) ? denial : undefined;
  }

  /** Highest trust-bundle sequence ever accepted on this device (0 when none). */
  async bundleSequence(): Promise<number> {
    return (await this.getMark("bundle_sequence")) ?? 0;
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

  /** The verified server time (unix seconds) the clock checks go by, if any. */
  timeHighWater(): Promise<number | undefined> {
    return this.getMark("time_high_water");
  }

  /**
   * Raises the mark to a verified time, or (`fresh`) sets it, even lower. Fresh is an answer to
   * this device's own request (its nonce) that no other verified answer overtook while it was in
   * flight: it tells the server's time now, so a time the server once signed wrongly ahead (a
   * clock glitch) is forgiven at the next contact instead of when real time catches up. An answer
   * held back on its way is overtaken by the ones that came meanwhile, and only raises the mark;
   * so does an offline package's issue time, which may be old.
   */
  setTimeHighWater(serverTime: number, options: { fresh: boolean }): Promise<void> {
    return this.oneAtATime(async () => {
      const current = await this.timeHighWater();
      if (options.fresh || current === undefined || serverTime > current)
        await this.set("time_high_water", String(serverTime));
    });
  }

  /**
   * Highest local clock reading seen since the last verified server time. A clock set back while
   * offline goes behind it, even when the signed high-water is older than the jump.
   */
  localHighWater(): Promise<number | undefined> {
    return this.getMark("local_high_water");
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
  /**
   * Forgets an activation that has ended (deactivated by this device, or a signed 410), and
   * remembers its id: an offline package for it, loaded again, must not bring it back.
   */
  async clearActivation(endedActivationId: string): Promise<void> {
    const ended = await this.endedActivations();
    if (!ended.includes(endedActivationId))
      await this.setJson("ended_activations", {
        ids: [...ended, endedActivationId].slice(-MAX_ENDED_ACTIVATIONS),
      });
    await this.delete("activation");
    await this.delete("certificate");
    await this.delete("last_heartbeat");
    await this.delete("newest_answer");
  }

  /** Activations that ended on this device, oldest first; an unreadable list counts as empty. */
  async endedActivations(): Promise<string[]> {
    const stored = await this.getJsonOrNone<{ ids?: unknown }>("ended_activations");
    return Array.isArray(stored?.ids) ? stored.ids.filter((id): id is string => typeof id === "string") : [];
  }

  /**
   * Remembers that a newer offline package (issued at `replacedAt`) replaced an activation. Not as
   * ended: the activation may still hold its slot on the service, which hands the device a package
   * of it again when asked (a later one, taken); only its packages from before are old news.
   */
  async recordReplacedActivation(activationId: string, replacedAt: number): Promise<void> {
    const others = (await this.replacedActivations()).filter((r) => r.activation_id !== activationId);
    const entries = [...others, { activation_id: activationId, replaced_at: replacedAt }];
    await this.setJson("replaced_activations", { entries: entries.slice(-MAX_REPLACED_ACTIVATIONS) });
  }

  /** When a newer package replaced this activation on this device, if it did (the latest time). */
  async replacedAt(activationId: string): Promise<number | undefined> {
    return (await this.replacedActivations()).find((r) => r.activation_id === activationId)?.replaced_at;
  }

  private replacedActivations(): Promise<ReplacedActivation[]> {
    return this.entriesOf(
      "replaced_activations",
      (r): r is ReplacedActivation =>
        isRecord(r) && typeof r.activation_id === "string" && Number.isSafeInteger(r.replaced_at),
    );
  }

  /**
   * Remembers a signed license-state denial (revoked, expired, suspended) by its license: it is
   * about the license, so it outlives the activation it named (deactivated, cleared, replaced),
   * and stands against that license's offline packages issued before it (denials.ts). One per
   * license, the latest signed.
   */
  async recordLicenseDenial(licenseId: string, denial: StoredDenial): Promise<void> {
    const entries = await this.licenseDenials();
    const held = entries.find((entry) => entry.license_id === licenseId);
    if (held && held.denial.server_time >= denial.server_time) return;
    const others = entries.filter((entry) => entry.license_id !== licenseId);
    const kept = [...others, { license_id: licenseId, denial }].slice(-MAX_LICENSE_DENIALS);
    await this.setJson("license_denials", { entries: kept });
  }

  /** The latest signed license-state denial remembered for this license, if any. */
  async licenseDenial(licenseId: string): Promise<StoredDenial | undefined> {
    return (await this.licenseDenials()).find((entry) => entry.license_id === licenseId)?.denial;
  }

  private licenseDenials(): Promise<LicenseDenial[]> {
    return this.entriesOf(
      "license_denials",
      (entry): entry is LicenseDenial =>
        isRecord(entry) && typeof entry.license_id === "string" && isStoredDenial(entry.denial),
    );
  }

  /**
   * A stored `{ entries: [...] }` list, oldest first. An unreadable list counts as empty and an
   * unreadable entry as absent (as ended_activations): a damaged memory forgets, never throws.
   */
  private async entriesOf<T>(item: Item, isEntry: (value: unknown) => value is T): Promise<T[]> {
    const stored = await this.getJsonOrNone<{ entries?: unknown }>(item);
    return Array.isArray(stored?.entries) ? stored.entries.filter(isEntry) : [];
  }

  /** The second the newest signed answer behind the stored activation state was signed. */
  async newestAnswer(): Promise<number | undefined> {
    const newest = await this.getMark("newest_answer");
    if (newest !== undefined) return newest;
    const last = await this.getJsonOrNone<StoredHeartbeat>("last_heartbeat");
    return Number.isSafeInteger(last?.server_time) ? last?.server_time : undefined;
  }

  /** Sets it (`reset`: a new activation starts its own history), else only ever raises it. */
  async setNewestAnswer(serverTime: number, options = { reset: false }): Promise<void> {
    const newest = options.reset ? undefined : await this.getMark("newest_answer");
    if (newest === undefined || serverTime > newest) await this.set("newest_answer", String(serverTime));
  }
}
