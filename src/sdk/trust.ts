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
 */
import type { ResolvedConfig } from "./config.ts";
import { SdkError } from "./errors.ts";
import { type FetchLike, send, serverError } from "./http.ts";
import type { ClientState, StoredBundle } from "./state.ts";
import { isRecord } from "./util.ts";
import { type TrustBundle, verifyTrustBundle } from "./verify.ts";

export class TrustManager {
  private memo: { bundle: TrustBundle; fetchedAtMs: number } | undefined;
  /** Bundles are persisted one at a time (see `persist`). */
  private persisting: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly config: ResolvedConfig,
    private readonly fetchImpl: FetchLike,
    private readonly state: ClientState,
    private readonly now: () => number,
    private readonly maxAgeMs: number,
  ) {}

  /** The cached bundle, re-verified, without any network use; undefined when none is usable. */
  async cached(): Promise<TrustBundle | undefined> {
    if (this.memo) return this.memo.bundle;
    const stored = await this.state.getJson<StoredBundle>("bundle").catch(() => undefined);
    if (!stored || typeof stored.fetched_at_ms !== "number") return undefined;
    try {
      const verified = verifyTrustBundle(stored.signed, {
        config: this.config,
        highestSequence: await this.state.bundleSequence(),
      });
      this.memo = { bundle: verified.bundle, fetchedAtMs: stored.fetched_at_ms };
      return verified.bundle;
    } catch {
      return undefined;
    }
  }

  private isStale(fetchedAtMs: number): boolean {
    const age = this.now() - fetchedAtMs;
    return age > this.maxAgeMs || age < -this.maxAgeMs;
  }

  /** A verified bundle for verifying a response: the cache while fresh, else a refetch. */
  async current(): Promise<TrustBundle> {
    const cached = await this.cached();
    if (cached && this.memo && !this.isStale(this.memo.fetchedAtMs)) return cached;
    try {
      return await this.refresh();
    } catch (error) {
      const offline = error instanceof SdkError && (error.kind === "network" || error.kind === "server");
      if (cached && offline) return cached;
      throw error;
    }
  }

  /**
   * Takes a bundle that arrived another way (inside an offline package) and was verified by the
   * caller; kept only when it is not older than the one held.
   */
  async adopt(signed: unknown, bundle: TrustBundle): Promise<void> {
    await this.persist(signed, bundle);
  }

  /**
   * Stores a verified bundle unless a newer one was stored meanwhile, and returns the bundle now
   * held. One at a time: two refreshes in flight (the heartbeat loop and a lease call) could
   * otherwise each read the highest sequence before the other wrote it, and the slower one would
   * leave the older bundle stored, below a sequence it had already accepted (protocol §4).
   */
  private persist(signed: unknown, bundle: TrustBundle): Promise<TrustBundle> {
    const run = this.persisting.then(async () => {
      const highest = await this.state.bundleSequence();
      if (bundle.sequence < highest) return this.memo?.bundle ?? (await this.cached()) ?? bundle;
      const fetchedAtMs = this.now();
      // The sequence first: a crash between the two writes leaves a floor, never a rollback.
      await this.state.raiseBundleSequence(bundle.sequence);
      const stored: StoredBundle = { signed, fetched_at_ms: fetchedAtMs };
      await this.state.setJson("bundle", stored);
      this.memo = { bundle, fetchedAtMs };
      return bundle;
    });
    this.persisting = run.catch(() => undefined);
    return run;
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
    return this.persist(signed, verified.bundle);
  }
}
