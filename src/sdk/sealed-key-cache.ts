/**
 * The cache of sealed-file key answers behind openSealedFile: the service's answer for a file
 * (its data key sealed to this device's KEM key, for one activation), kept under
 * `sealed_file_keys` by the SHA-256 of the file's header, so the file opens again with no network.
 * The storage adapter stores whole strings, so the cache is one JSON object rewritten on each
 * change; it holds at most `maxEntries` answers, the most recently used, to keep each write small.
 */
import type { LockManagerLike } from "./device-key-store.ts";
import { usageError } from "./errors.ts";
import type { ClientState, StoredActivation } from "./state.ts";
import { isRecord, isString, serialized } from "./util.ts";

export interface CachedFileKey {
  activation_id: string;
  enc: string;
  wrapped_key: string;
}

/**
 * Key answers kept by default. An answer is about 300 bytes of JSON, so a full cache is about
 * 75 KB, and that is the most one open writes.
 */
export const DEFAULT_SEALED_FILE_KEY_CACHE_SIZE = 256;
/** The largest sealedFileKeyCacheSize allowed (a full cache of it is about 1.2 MB). */
export const MAX_SEALED_FILE_KEY_CACHE_SIZE = 4096;

/** The sealedFileKeyCacheSize option, checked: a whole number from 0 (no cache) to the maximum. */
export function checkSealedFileKeyCacheSize(value: unknown): number {
  if (value === undefined) return DEFAULT_SEALED_FILE_KEY_CACHE_SIZE;
  if (
    !Number.isSafeInteger(value) ||
    (value as number) < 0 ||
    (value as number) > MAX_SEALED_FILE_KEY_CACHE_SIZE
  )
    throw usageError(
      "INVALID_ARGUMENT",
      `sealedFileKeyCacheSize must be a whole number from 0 to ${MAX_SEALED_FILE_KEY_CACHE_SIZE}`,
    );
  return value as number;
}

function isCachedFileKey(value: unknown): value is CachedFileKey {
  return (
    isRecord(value) && isString(value.activation_id) && isString(value.enc) && isString(value.wrapped_key)
  );
}

export class SealedFileKeyCache {
  /**
   * Every change re-reads what is stored, changes it and writes it back, one at a time: opens
   * running at once each go to the network between their read and their write, and writing back
   * the copy read before would drop the answers the others stored meanwhile. Across clients on one
   * storage (tabs), the lock makes them take turns; on storage every tab sees at once (IndexedDB)
   * no answer is then lost, on `localStorage` fewer are.
   */
  private readonly inThisClient = serialized();

  constructor(
    private readonly state: ClientState,
    private readonly maxEntries: number,
    /** Other clients on the same storage (tabs) change it too: where there are locks, in turn. */
    private readonly locks: LockManagerLike | undefined,
  ) {}

  private oneAtATime(change: () => Promise<void>): Promise<void> {
    const locks = this.locks;
    if (!locks) return this.inThisClient(change);
    return this.inThisClient(() => locks.request(this.state.key("sealed_file_keys"), change));
  }

  /** The cached answer for a header, when it is for this activation. */
  async get(headerSha256: string, activationId: string): Promise<CachedFileKey | undefined> {
    if (this.maxEntries === 0) return undefined;
    const entry = (await this.read()).get(headerSha256);
    return entry?.activation_id === activationId ? entry : undefined;
  }

  /**
   * Marks a cached answer used. Only one in the older half moves to the newest end (a write);
   * opening a recent file again writes nothing, and a file in steady use is rewritten at most once
   * per maxEntries / 2 new files.
   */
  touch(headerSha256: string): Promise<void> {
    return this.oneAtATime(async () => {
      const entries = await this.read();
      const entry = entries.get(headerSha256);
      if (!entry) return;
      const newerThanIt = entries.size - 1 - [...entries.keys()].indexOf(headerSha256);
      if (newerThanIt < this.maxEntries / 2) return;
      entries.delete(headerSha256);
      entries.set(headerSha256, entry);
      await this.write(entries);
    });
  }

  /**
   * Stores an answer as the most recently used, dropping the least recently used beyond
   * maxEntries and those of other activations (they never open again: the key is sealed for
   * one). Not stored when the activation is no longer the one held (an answer that landed after
   * a deactivation or a replacement).
   */
  put(headerSha256: string, entry: CachedFileKey): Promise<void> {
    return this.oneAtATime(async () => {
      // No cache: nothing to write at each open, only a cache left from a larger size to drop.
      if (this.maxEntries === 0) {
        if ((await this.state.get("sealed_file_keys")) !== undefined)
          await this.state.delete("sealed_file_keys");
        return;
      }
      const held = await this.state.getJsonOrNone<StoredActivation>("activation");
      if (held?.activation_id !== entry.activation_id) return;
      const entries = await this.read();
      for (const [hash, other] of entries)
        if (other.activation_id !== entry.activation_id) entries.delete(hash);
      entries.delete(headerSha256);
      entries.set(headerSha256, entry);
      for (const hash of entries.keys()) {
        if (entries.size <= this.maxEntries) break;
        entries.delete(hash);
      }
      await this.write(entries);
    });
  }

  /**
   * Oldest use first. The stored object keeps that order: its keys are header hashes (64 hex
   * digits), never array indices, which JSON objects would put first. Entries that cannot be
   * read are left out, and a cache that cannot be read counts as empty (it is only a cache); a
   * read the storage adapter fails is still an error.
   */
  private async read(): Promise<Map<string, CachedFileKey>> {
    const stored = await this.state.getJsonOrNone<Record<string, unknown>>("sealed_file_keys");
    const entries = new Map<string, CachedFileKey>();
    for (const [hash, entry] of Object.entries(stored ?? {}))
      if (isCachedFileKey(entry)) entries.set(hash, entry);
    return entries;
  }

  private write(entries: Map<string, CachedFileKey>): Promise<void> {
    return this.state.setJson("sealed_file_keys", Object.fromEntries(entries));
  }
}
