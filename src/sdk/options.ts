/** The options of LicensingClient (docs/sdk.md lists them with their defaults). */
import type { ServiceConfig } from "./config.ts";
import type { LockManagerLike } from "./device-key-store.ts";
import type { FetchLike } from "./http.ts";
import type { KeyAlgorithm } from "./keys.ts";
import type { BackoffOptions, Timer } from "./loop.ts";
import type { Storage } from "./storage.ts";

export interface LicensingClientOptions {
  /** The integration config (service.config.json), or the management response data around it. */
  config: ServiceConfig | Record<string, unknown>;
  fetch?: FetchLike;
  /** Defaults to MemoryStorage (nothing survives a restart). */
  storage?: Storage;
  /** Local clock in milliseconds. */
  now?: () => number;
  /**
   * Milliseconds from a clock that is never set, for how long an answer was on its way (default
   * performance.now()).
   */
  monotonicNow?: () => number;
  sdkVersion?: string;
  appVersion?: string;
  /** Algorithm of a newly generated device signing key (default "ed25519"). */
  signingAlgorithm?: KeyAlgorithm;
  timer?: Timer;
  /** Uniform [0, 1) source for back-off jitter (default Math.random). */
  random?: () => number;
  /** Refetch the trust bundle when the cached one is older than this (default 1 hour). */
  trustBundleMaxAgeMs?: number;
  /**
   * Verify signed online answers with a trust bundle only while the service confirmed it (a
   * successful refetch) within this many ms; past that, with the refetch failing, they are
   * refused with BUNDLE_UNCONFIRMED. Default DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS (7 days), at
   * most MAX_TRUST_BUNDLE_UNCONFIRMED_MS (30 days). The offline state is not affected.
   */
  trustBundleMaxUnconfirmedMs?: number;
  /**
   * How many sealed-file key answers openSealedFile keeps, the most recently used (default
   * DEFAULT_SEALED_FILE_KEY_CACHE_SIZE, 256; 0 keeps none; at most MAX_SEALED_FILE_KEY_CACHE_SIZE).
   */
  sealedFileKeyCacheSize?: number;
  backoff?: BackoffOptions;
  /** Web Locks, for tabs sharing storage (default navigator.locks where present; device-key-store.ts). */
  locks?: LockManagerLike;
}
