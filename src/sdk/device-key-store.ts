/**
 * The device keys in storage. Storage is the truth, read again at every use: the stored
 * activation is bound to the stored keys, and other clients on the same storage (browser tabs)
 * and the app itself (clearing its storage at sign-out) change what is stored under a running
 * client. A client that kept its first keys in memory would sign with keys no stored activation
 * is bound to, or leave an activation stored next to keys that never signed it.
 */
import {
  type DeviceKeys,
  exportDeviceKeys,
  generateDeviceKeys,
  importDeviceKeys,
  type KeyAlgorithm,
  sameKeyPair,
} from "./keys.ts";
import type { ClientState } from "./state.ts";
import { serialized } from "./util.ts";

/** The part of the Web Locks API the client uses: `callback` runs while it holds lock `name`. */
export interface LockManagerLike {
  request<T>(name: string, callback: () => Promise<T>): Promise<T>;
}

/** navigator.locks, where there is one (browsers in a secure context). */
export function platformLocks(): LockManagerLike | undefined {
  const platform = globalThis as { navigator?: { locks?: LockManagerLike } };
  const locks = platform.navigator?.locks;
  return locks ? deniedLocksRunUnlocked(locks) : undefined;
}

/**
 * Locks that run the callback without the lock where the platform denies them: an opaque origin
 * (a sandboxed iframe) has `navigator.locks`, but each request rejects with SecurityError, and
 * such a context shares no storage with any other to take turns over. Only a refusal before the
 * callback ran counts: an error the callback throws is the callback's.
 */
export function deniedLocksRunUnlocked(locks: LockManagerLike): LockManagerLike {
  return {
    async request<T>(name: string, callback: () => Promise<T>): Promise<T> {
      let started = false;
      try {
        return await locks.request(name, () => {
          started = true;
          return callback();
        });
      } catch (error) {
        if (started || (error as { name?: unknown } | null)?.name !== "SecurityError") throw error;
        return callback();
      }
    },
  };
}

export class DeviceKeyStore {
  /** The keys this client last read from storage or wrote there. */
  private known: DeviceKeys | undefined;
  /** One look-up at a time: two first calls of one client must not make two key pairs. */
  private readonly oneAtATime = serialized();

  constructor(
    private readonly state: ClientState,
    private readonly signingAlgorithm: KeyAlgorithm,
    private readonly locks: LockManagerLike | undefined,
  ) {}

  /**
   * The keys storage holds now. When it holds none, the keys this client already used are
   * written back (the app cleared its storage under a running client: those keys may hold a
   * server activation, which the same keys get back, while new ones would take another slot),
   * else new keys are generated; under the origin-wide lock where there is one, so that tabs
   * starting together end up with one key pair.
   */
  current(): Promise<DeviceKeys> {
    return this.oneAtATime(async () => {
      const stored = await this.state.get("device_keys");
      if (stored !== undefined) return this.adopt(stored);
      return this.underLock(async () => {
        const meanwhile = await this.state.get("device_keys");
        if (meanwhile !== undefined) return this.adopt(meanwhile);
        const keys = this.known ?? generateDeviceKeys(this.signingAlgorithm);
        await this.state.set("device_keys", exportDeviceKeys(keys));
        this.known = keys;
        return keys;
      });
    });
  }

  /**
   * Stores `keys` in place of the current ones, once `allowed` passes. The check runs with the
   * write under the same locks an activation is stored under (this client's activation records,
   * the origin-wide lock): checked before them, another client could store an activation bound to
   * the current keys between the check and the write, and be left with keys that never signed it.
   */
  replace(keys: DeviceKeys, allowed: () => Promise<void>): Promise<void> {
    return this.oneAtATime(() =>
      this.state.activationRecords(() =>
        this.underLock(async () => {
          await allowed();
          await this.state.set("device_keys", exportDeviceKeys(keys));
          this.known = keys;
        }),
      ),
    );
  }

  /**
   * Whether storage holds `keys` (the ones that signed an activation request): written when it
   * holds none (cleared while the request was in flight); false when it holds others, which
   * another client on the same storage wrote meanwhile. Run it under `underLock`, with the writes
   * of the activation it decides.
   */
  async bind(keys: DeviceKeys): Promise<boolean> {
    const stored = await this.state.get("device_keys");
    if (stored === undefined) {
      await this.state.set("device_keys", exportDeviceKeys(keys));
      this.known = keys;
      return true;
    }
    const held = importDeviceKeys(stored);
    return sameKeyPair(held.signing, keys.signing) && sameKeyPair(held.kem, keys.kem);
  }

  /** Runs `change` holding the origin-wide device-keys lock, where the platform has locks. */
  underLock<T>(change: () => Promise<T>): Promise<T> {
    return this.locks ? this.locks.request(this.state.key("device_keys"), change) : change();
  }

  private adopt(stored: string): DeviceKeys {
    this.known = importDeviceKeys(stored);
    return this.known;
  }
}
