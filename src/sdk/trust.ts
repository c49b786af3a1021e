/**
 * Obtains, verifies, caches and refreshes the product's trust bundle.
 *
 * - The bundle is fetched from trust_anchor.trust_bundle_url (or
 *   {api_url}/runtime/v1/products/{product_id}/trust-bundle) and verified against the root key of
 *   the config's environment; the highest accepted sequence is persisted first, then the bundle.
 * - A cached bundle is re-verified whenever it is read back from storage.
 * - It is refetched when older than `maxAgeMs` (local clock) and when a response names a signing
 *   key the cached bundle does not list. If a refetch fails on the network, the cached bundle
 *   stays in use; a refetched bundle that fails verification is an error.
 * - A signed online answer is verified only with a bundle the service confirmed (a successful
 *   refetch) within `maxUnconfirmedMs` (forAnswer). Past that, with the refetch failing, the
 *   answer is refused (BUNDLE_UNCONFIRMED): a device whose refetches fail (a blocked trust-bundle
 *   URL) would otherwise go on trusting a key declared compromised since, for ever. What is
 *   already stored (the certificate, licenseState()) keeps working with the cached bundle.
 */
import type { ResolvedConfig } from "./config.ts";
import { SdkError, usageError } from "./errors.ts";
import { type FetchLike, send, serverError } from "./http.ts";
import type { ClientState, StoredBundle } from "./state.ts";
import { isRecord } from "./util.ts";
import { type TrustBundle, verifyTrustBundle } from "./verify.ts";

/**
 * How long signed online answers are verified with a trust bundle the service has not confirmed
 * (no successful refetch) by default: 7 days. A key declared compromised reaches a device
 * through the bundle alone, so this bounds how long one whose refetches fail keeps taking answers
 * signed under that key. LicensingClientOptions.trustBundleMaxUnconfirmedMs changes it, up to
 * MAX_TRUST_BUNDLE_UNCONFIRMED_MS.
 */
export const DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS = 7 * 86_400_000;
/** The longest trustBundleMaxUnconfirmedMs allowed: 30 days. */
export const MAX_TRUST_BUNDLE_UNCONFIRMED_MS = 30 * 86_400_000;

/** The trustBundleMaxUnconfirmedMs option, checked: whole ms from 0 to the maximum. */
export function checkMaxUnconfirmedMs(value: unknown): number {
  if (value === undefined) return DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS;
  if (
    !Number.isSafeInteger(value) ||
    (value as number) < 0 ||
    (value as number) > MAX_TRUST_BUNDLE_UNCONFIRMED_MS
  )
    throw usageError(
      "INVALID_ARGUMENT",
      `trustBundleMaxUnconfirmedMs must be whole milliseconds from 0 to ${MAX_TRUST_BUNDLE_UNCONFIRMED_MS} (30 days)`,
    );
  return value as number;
}

interface Memo {
  bundle: TrustBundle;
  /** The bundle as stored: `{ bundle, root_signature }` as received. */
  signed: unknown;
  fetchedAtMs: number;
  /** When the service last confirmed the bundle held (ms, on confirmationClock); none: never. */
  confirmedAtMs: number | undefined;
}

export class TrustManager {
  private memo: Memo | undefined;
  /** Bundles are persisted one at a time (see `persist`). */
  private persisting: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly config: ResolvedConfig,
    private readonly fetchImpl: FetchLike,
    private readonly state: ClientState,
    private readonly now: () => number,
    private readonly maxAgeMs: number,
    private readonly maxUnconfirmedMs: number = DEFAULT_TRUST_BUNDLE_MAX_UNCONFIRMED_MS,
  ) {}

  /**
   * The cached bundle, re-verified, without any network use; undefined when none is usable.
   * Throws STORAGE_UNAVAILABLE when the storage adapter fails to read it (cachedMemo).
   */
  async cached(): Promise<TrustBundle | undefined> {
    return (await this.cachedMemo())?.bundle;
  }

  /**
   * Unreadable contents (STORAGE_CORRUPT) or a bundle that no longer verifies count as none, and
   * are fetched again; a read the storage adapter fails is STORAGE_UNAVAILABLE, never taken for no
   * bundle (which would let a locked file lift what the stored bundle says: a compromised key).
   */
  private async cachedMemo(): Promise<Memo | undefined> {
    if (this.memo) return this.memo;
    const stored = await this.state.getJsonOrNone<StoredBundle>("bundle");
    if (!stored || typeof stored.fetched_at_ms !== "number") return undefined;
    const highestSequence = await this.state.bundleSequence();
    try {
      const verified = verifyTrustBundle(stored.signed, { config: this.config, highestSequence });
      // A bundle stored before confirmations were recorded counts as never confirmed: its
      // fetched_at_ms was also written when an offline package's (possibly old) bundle was taken,
      // so it does not say the service vouched for it. The next online answer refetches first.
      const confirmed = stored.confirmed_at_ms;
      this.memo = {
        bundle: verified.bundle,
        signed: stored.signed,
        fetchedAtMs: stored.fetched_at_ms,
        confirmedAtMs: typeof confirmed === "number" && Number.isFinite(confirmed) ? confirmed : undefined,
      };
      return this.memo;
    } catch {
      return undefined;
    }
  }

  private isStale(fetchedAtMs: number): boolean {
    const age = this.now() - fetchedAtMs;
    return age > this.maxAgeMs || age < -this.maxAgeMs;
  }

  /**
   * The clock confirmations are read on: the local clock, but never behind the verified server
   * time or the latest local time the device has seen (state.ts), so putting the clock back does
   * not make an old confirmation look recent.
   */
  private async confirmationClock(): Promise<number> {
    const marks = [await this.state.timeHighWater(), await this.state.localHighWater()];
    return Math.max(this.now(), ...marks.map((sec) => (sec === undefined ? 0 : sec * 1000)));
  }

  /** Whether the service confirmed the bundle held within maxUnconfirmedMs (either way in time). */
  private async confirmedRecently(memo: Memo): Promise<boolean> {
    if (memo.confirmedAtMs === undefined) return false;
    const age = (await this.confirmationClock()) - memo.confirmedAtMs;
    return age <= this.maxUnconfirmedMs && age >= -this.maxUnconfirmedMs;
  }

  /** A verified bundle (the cache while fresh, else a refetch; the cache when that fails). */
  async current(): Promise<TrustBundle> {
    const cached = await this.cachedMemo();
    if (cached && !this.isStale(cached.fetchedAtMs)) return cached.bundle;
    try {
      return await this.refresh();
    } catch (error) {
      if (cached && refetchUnavailable(error)) return cached.bundle;
      throw error;
    }
  }

  /**
   * A verified bundle to verify a signed online answer with: as current(), but the cache stands
   * in for a failed refetch only while the service confirmed it within maxUnconfirmedMs; past
   * that, the answer is refused with BUNDLE_UNCONFIRMED (retryable; the refetch's error is its
   * cause). A cache older than that is refetched even while otherwise fresh.
   */
  async forAnswer(): Promise<TrustBundle> {
    const cached = await this.cachedMemo();
    const confirmed = cached !== undefined && (await this.confirmedRecently(cached));
    if (cached && confirmed && !this.isStale(cached.fetchedAtMs)) return cached.bundle;
    try {
      return await this.refresh();
    } catch (error) {
      if (!(cached && refetchUnavailable(error))) throw error;
      if (confirmed) return cached.bundle;
      const confirmedAt = cached.confirmedAtMs;
      throw new SdkError(
        "BUNDLE_UNCONFIRMED",
        "the trust bundle could not be refetched, and the one held was not confirmed by the service recently enough to verify answers with",
        {
          kind: "verification",
          retryable: true,
          cause: error,
          details: {
            confirmed_at: confirmedAt === undefined ? null : Math.floor(confirmedAt / 1000),
            max_unconfirmed_sec: Math.floor(this.maxUnconfirmedMs / 1000),
          },
        },
      );
    }
  }

  /**
   * Takes a bundle that arrived another way (inside an offline package) and was verified by the
   * caller; kept only when it is not older than the one held. It confirms nothing: a package may
   * be old, and carries the bundle of its issue.
   */
  async adopt(signed: unknown, bundle: TrustBundle): Promise<void> {
    await this.persist(signed, bundle, { confirmed: false });
  }

  /**
   * Stores a verified bundle unless a newer one was stored meanwhile, and returns the bundle now
   * held. One at a time: two refreshes in flight (the heartbeat loop and a lease call) could
   * otherwise each read the highest sequence before the other wrote it, and the slower one would
   * leave the older bundle stored, below a sequence it had already accepted (protocol §4).
   * `confirmed`: the service just answered with this bundle; the one held (this one, or a newer
   * one) is then confirmed now. Otherwise the held confirmation carries over: a newer bundle says
   * at least what the confirmed one said.
   */
  private persist(
    signed: unknown,
    bundle: TrustBundle,
    options: { confirmed: boolean },
  ): Promise<TrustBundle> {
    const run = this.persisting.then(async () => {
      const highest = await this.state.bundleSequence();
      const held = await this.cachedMemo();
      const confirmedAtMs = options.confirmed ? await this.confirmationClock() : held?.confirmedAtMs;
      if (bundle.sequence < highest) {
        if (!held) return bundle;
        if (options.confirmed) await this.store(held.bundle, held.signed, held.fetchedAtMs, confirmedAtMs);
        return held.bundle;
      }
      // The sequence first: a crash between the two writes leaves a floor, never a rollback.
      await this.state.raiseBundleSequence(bundle.sequence);
      await this.store(bundle, signed, this.now(), confirmedAtMs);
      return bundle;
    });
    this.persisting = run.catch(() => undefined);
    return run;
  }

  /**
   * Writes the bundle held in memory back when storage has none (the app cleared its storage
   * under a running client), with its sequence first as persist() does: a certificate stored next
   * must verify after a restart, and the rollback floor must not be lost with it.
   */
  restoreStored(): Promise<void> {
    const run = this.persisting.then(async () => {
      const memo = this.memo;
      if (!memo || (await this.state.get("bundle")) !== undefined) return;
      await this.state.raiseBundleSequence(memo.bundle.sequence);
      await this.store(memo.bundle, memo.signed, memo.fetchedAtMs, memo.confirmedAtMs);
    });
    this.persisting = run.catch(() => undefined);
    return run;
  }

  private async store(
    bundle: TrustBundle,
    signed: unknown,
    fetchedAtMs: number,
    confirmedAtMs: number | undefined,
  ): Promise<void> {
    const stored: StoredBundle = {
      signed,
      fetched_at_ms: fetchedAtMs,
      ...(confirmedAtMs === undefined ? {} : { confirmed_at_ms: confirmedAtMs }),
    };
    await this.state.setJson("bundle", stored);
    this.memo = { bundle, signed, fetchedAtMs, confirmedAtMs };
  }

  /** Fetches, verifies and persists the bundle; throws on any failure. */
  async refresh(): Promise<TrustBundle> {
    const res = await send(this.fetchImpl, this.config.trustBundleUrl, {
      method: "GET",
      headers: { accept: "application/json" },
    });
    if (res.status !== 200) throw serverError(res, this.now());
    if (!isRecord(res.body) || !isRecord(res.body.data)) {
      throw new SdkError("BUNDLE_INVALID", "trust-bundle response has no data", {
        kind: "verification",
        status: res.status,
      });
    }
    const signed = res.body.data;
    const verified = verifyTrustBundle(signed, {
      config: this.config,
      highestSequence: await this.state.bundleSequence(),
    });
    return this.persist(signed, verified.bundle, { confirmed: true });
  }
}

/** A refetch that failed on the way (network, or the server's unsigned error), not a bad bundle. */
function refetchUnavailable(error: unknown): boolean {
  return error instanceof SdkError && (error.kind === "network" || error.kind === "server");
}
