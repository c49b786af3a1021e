import { generateKeyPairSync, type KeyObject } from "node:crypto";
import { and, eq } from "drizzle-orm";
import { keyIdOf, publicKeyText } from "../../crypto/keys.ts";
import { productSigningEntryId } from "../../crypto/keystore.ts";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { Actor } from "../../store/schema/audit.ts";
import { products, signingKeys, trustBundles } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import {
  bundleIsStale,
  listedKeys,
  newlyCompromised,
  type SignedTrustBundle,
  type SigningKeyRow,
  signBundle,
  type TrustBundleBody,
} from "./bundle.ts";
import { defaultRetention, type InvalidatedPackages, packagesOutliving } from "./retention.ts";

/** What `rotate` did; snake_case because the command line prints it as JSON. */
export interface Rotation {
  key_id: string;
  trust_bundle_sequence: number;
  /** The key that was active before, now retired; null for a product that had none. */
  retired: {
    key_id: string;
    not_after: number;
    /**
     * Unexpired packages it signed (of licenses not revoked): what keeps it listed past the
     * longest certificate lifetime under the default retention.
     */
    unexpired_offline_packages: InvalidatedPackages;
    /** Packages it signed that outlive `not_after`: non-zero only with a shorter retention asked for. */
    invalidated_offline_packages: InvalidatedPackages;
    /**
     * Unix seconds: until when an online certificate it signed may stay usable (the longest
     * `cert_ttl_sec`, plus `network_grace_sec` of a fail-open policy, from now); null when the
     * product has no policy. Later than `not_after` only with a shorter retention asked for: a
     * device that fetches the new bundle then takes such a certificate for invalid from
     * `not_after` on, grace or not.
     */
    certificates_usable_until: number | null;
  } | null;
}

export interface Retirement {
  key_id: string;
  status: "retired" | "compromised";
  trust_bundle_sequence: number;
  /** Unexpired packages it signed: from now on, devices with the new bundle refuse them. */
  invalidated_offline_packages: InvalidatedPackages;
}

/** A request the key's state does not allow (unknown key, the active one, one already retired); nothing was changed. */
export class SigningKeyError extends Error {
  override name = "SigningKeyError";
}

interface NewKey {
  keyId: string;
  publicKey: string;
  now: Date;
}

/** What the lifecycle needs of the TrustService that owns it. */
export interface KeyHost {
  rootKey(environment: Environment): { keyId: string; privateKey: KeyObject };
  /** Drops what the process remembers of the product's keys (active row, online signers). */
  forget(productId: string): void;
  /** A key just made: its private half, so this process need not read the keystore back. */
  remember(keyId: string, privateKey: KeyObject): void;
}

/**
 * Creating, rotating and retiring product signing keys, and (re)building the signed trust bundle
 * that lists them (protocol §4). Every change runs in ONE immediate write transaction holding the
 * key rows, the new bundle and the audit record, so the command line can change keys while the
 * server runs and a failure leaves everything as it was.
 */
export class KeyLifecycle {
  constructor(
    private readonly deps: Deps,
    private readonly host: KeyHost,
  ) {}

  /**
   * Gives a product its first signing key and bundle. Safe to call again: a product that already
   * has an active key is left alone. On failure the product stays `pending` and is retried.
   */
  provision(productId: string): void {
    const product = this.deps.db.select().from(products).where(eq(products.id, productId)).get();
    if (!product || product.signingStatus === "ready") return;
    const fresh = this.activeKeyNow(productId) ? null : this.newKeyPair(product.environment);
    this.inWriteTransaction(productId, () => {
      // Re-read under the write lock: another process may have provisioned it meanwhile (then
      // the key made above stays unused in the keystore, which is harmless).
      const current = this.deps.db.select().from(products).where(eq(products.id, productId)).get();
      if (!current || current.signingStatus === "ready") return;
      if (fresh && !this.activeKeyNow(productId)) this.insertKey(productId, fresh);
      this.deps.db.update(products).set({ signingStatus: "ready" }).where(eq(products.id, productId)).run();
      this.writeBundle(productId);
    });
  }

  /** Products left `pending` (a failed keystore write, a crash) get their keys now. */
  provisionPending(): number {
    const pending = this.deps.db
      .select({ id: products.id })
      .from(products)
      .where(eq(products.signingStatus, "pending"))
      .all();
    for (const { id } of pending) this.provision(id);
    return pending.length;
  }

  /**
   * A new active signing key; the previous one is retired and stays in the bundle for
   * `retainSec` (default: until everything it signed has expired, retention.ts), then drops out.
   * One write transaction holds every change, the new bundle and the audit record: a rotation
   * either happened completely or not at all, so the bundle always lists the key in use.
   */
  rotate(productId: string, options: { retainSec?: number; actor?: Actor } = {}): Rotation {
    const product = this.deps.db.select().from(products).where(eq(products.id, productId)).get();
    if (!product) throw ApiError.notFound("product");
    // Keystore first and outside the write lock (a file write under its own lock): a failure
    // after it leaves an unused key in the keystore, never a key row without its private half.
    const fresh = this.newKeyPair(product.environment);
    return this.inWriteTransaction(productId, () => {
      const nowSec = unixSeconds(fresh.now);
      const previous = this.activeKeyNow(productId);
      let retired: Rotation["retired"] = null;
      if (previous) {
        const retention = defaultRetention(this.deps.sqlite, productId, previous.keyId, nowSec);
        const notAfter = nowSec + (options.retainSec ?? retention.retainSec);
        // Retired before the new key is added: at most one key per product is ever active.
        this.setStatus(previous.keyId, "retired", notAfter, fresh.now);
        retired = {
          key_id: previous.keyId,
          not_after: notAfter,
          unexpired_offline_packages: retention.packages,
          invalidated_offline_packages: packagesOutliving(this.deps.sqlite, previous.keyId, notAfter),
          certificates_usable_until: retention.certificatesUsableUntil,
        };
      }
      this.insertKey(productId, fresh);
      this.deps.db.update(products).set({ signingStatus: "ready" }).where(eq(products.id, productId)).run();
      const sequence = this.writeBundle(productId).bundle.sequence;
      this.audit(product.environment, options.actor, productId, "signing_key.rotated", {
        key_id: fresh.keyId,
        trust_bundle_sequence: sequence,
        retired_key_id: retired?.key_id ?? null,
        retired_key_not_after: retired?.not_after ?? null,
      });
      return { key_id: fresh.keyId, trust_bundle_sequence: sequence, retired };
    });
  }

  /**
   * Retires a key that is no longer active, at once: it drops out of the bundle. A compromised
   * key instead stays listed as `compromised`, so devices refuse what it signed. Like `rotate`,
   * one write transaction with the bundle and the audit record.
   */
  retire(keyId: string, options: { compromised?: boolean; actor?: Actor } = {}): Retirement {
    const status = options.compromised === true ? "compromised" : "retired";
    const productId = this.keyRow(keyId)?.productId;
    if (productId === undefined) throw new SigningKeyError(`no signing key ${keyId}`);
    return this.inWriteTransaction(productId, () => {
      // Checked again under the write lock: a rotation may have committed since the caller looked.
      const row = this.keyRow(keyId);
      if (!row) throw new SigningKeyError(`no signing key ${keyId}`);
      if (row.status === "active")
        throw new SigningKeyError(`${keyId} is the active key; rotate first, then retire the old one`);
      if (row.status === "compromised")
        throw new SigningKeyError(`${keyId} is compromised; it stays listed as compromised`);
      const now = this.deps.clock.now();
      const nowSec = unixSeconds(now);
      // Retiring drops a key from the bundle at once; one already out of it has nothing left to
      // drop, and another bundle and audit record would report a change that did not happen.
      if (status === "retired" && row.status === "retired" && listedKeys([row], nowSec).length === 0)
        throw new SigningKeyError(`${keyId} is already retired and out of the trust bundle`);
      const invalidated = packagesOutliving(this.deps.sqlite, keyId, nowSec);
      this.setStatus(keyId, status, nowSec, now);
      const sequence = this.writeBundle(row.productId).bundle.sequence;
      const product = this.deps.db.select().from(products).where(eq(products.id, row.productId)).get();
      if (!product) throw new Error(`no product ${row.productId}`);
      this.audit(product.environment, options.actor, row.productId, `signing_key.${status}`, {
        key_id: keyId,
        trust_bundle_sequence: sequence,
      });
      return {
        key_id: keyId,
        status,
        trust_bundle_sequence: sequence,
        invalidated_offline_packages: invalidated,
      };
    });
  }

  /** Signs and stores the bundle of the product's current keys under the next sequence number. */
  rebuildBundle(productId: string): SignedTrustBundle {
    return this.inWriteTransaction(productId, () => this.writeBundle(productId));
  }

  /**
   * Rebuilds every bundle that no longer says what the key rows say (bundle.ts `bundleIsStale`):
   * retired keys whose retention has passed drop out, and a change whose rebuild never
   * committed (a rotation by an older version that failed half-way) is repaired.
   */
  pruneExpiredKeys(): number {
    const nowSec = unixSeconds(this.deps.clock.now());
    const stale = this.deps.db
      .select({ productId: trustBundles.productId, bundle: trustBundles.bundle })
      .from(trustBundles)
      .all()
      .filter(({ productId, bundle }) =>
        bundleIsStale(JSON.parse(bundle) as TrustBundleBody, this.keysOf(productId), nowSec),
      );
    for (const { productId } of stale) this.rebuildBundle(productId);
    return stale.length;
  }

  /**
   * BEGIN IMMEDIATE: the write lock is taken before anything is read, so the busy timeout covers
   * a server writing at the same moment. A deferred transaction would read first, and a commit by
   * the server before its first write fails it with SQLITE_BUSY_SNAPSHOT, which no timeout retries.
   */
  private inWriteTransaction<T>(productId: string, work: () => T): T {
    try {
      return this.deps.db.transaction(() => work(), { behavior: "immediate" });
    } finally {
      // Committed or rolled back, what this process remembers of the product's keys may be wrong.
      this.host.forget(productId);
    }
  }

  /** Reads the bundle's keys and signs it: inside the caller's write transaction, so nothing changes in between. */
  private writeBundle(productId: string): SignedTrustBundle {
    const product = this.deps.db.select().from(products).where(eq(products.id, productId)).get();
    if (!product) throw new Error(`no product ${productId}`);
    const now = this.deps.clock.now();
    const nowSec = unixSeconds(now);
    const root = this.host.rootKey(product.environment);
    const sequence = product.trustBundleSequence + 1;
    const keys = listedKeys(this.keysOf(productId), nowSec);
    const { bundle, text, rootSignature } = signBundle(
      {
        product_id: productId,
        environment: product.environment,
        sequence,
        issued_at: nowSec,
        root_key_id: root.keyId,
        signing_keys: keys,
      },
      root.privateKey,
    );
    const minimum =
      product.trustBundleMinimumSequence === 0 || newlyCompromised(this.storedBundle(productId), keys)
        ? sequence
        : product.trustBundleMinimumSequence;
    this.deps.db
      .update(products)
      .set({ trustBundleSequence: sequence, trustBundleMinimumSequence: minimum })
      .where(eq(products.id, productId))
      .run();
    this.deps.db
      .insert(trustBundles)
      .values({ productId, sequence, bundle: text, rootSignature, issuedAt: now })
      .onConflictDoUpdate({
        target: trustBundles.productId,
        set: { sequence, bundle: text, rootSignature, issuedAt: now },
      })
      .run();
    return { bundle, root_signature: rootSignature };
  }

  /** The bundle devices hold now, before the one being written replaces it. */
  private storedBundle(productId: string): TrustBundleBody | undefined {
    const row = this.deps.db
      .select({ bundle: trustBundles.bundle })
      .from(trustBundles)
      .where(eq(trustBundles.productId, productId))
      .get();
    return row ? (JSON.parse(row.bundle) as TrustBundleBody) : undefined;
  }

  /** The active key as committed now, never from the memo: for decisions made under the write lock. */
  private activeKeyNow(productId: string): SigningKeyRow | undefined {
    return this.deps.db
      .select()
      .from(signingKeys)
      .where(and(eq(signingKeys.productId, productId), eq(signingKeys.status, "active")))
      .get();
  }

  /** Keystore first, then the store: a crash in between leaves an unused key, never a key-less row. */
  private newKeyPair(environment: Environment): NewKey {
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    const text = publicKeyText(publicKey);
    const keyId = keyIdOf(text);
    const now = this.deps.clock.now();
    this.deps.keystore.add([
      {
        metadata: {
          id: productSigningEntryId(keyId),
          kind: "product_signing_key",
          environment,
          alg: "ed25519",
          created_at: now.toISOString(),
        },
        secret: new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" })),
      },
    ]);
    this.host.remember(keyId, privateKey);
    return { keyId, publicKey: text, now };
  }

  private insertKey(productId: string, key: NewKey): void {
    this.deps.db
      .insert(signingKeys)
      .values({
        keyId: key.keyId,
        productId,
        publicKey: key.publicKey,
        status: "active",
        notBefore: unixSeconds(key.now),
        notAfter: null,
        createdAt: key.now,
      })
      .run();
  }

  private setStatus(keyId: string, status: "retired" | "compromised", notAfter: number, now: Date): void {
    this.deps.db
      .update(signingKeys)
      .set({ status, notAfter, retiredAt: now })
      .where(eq(signingKeys.keyId, keyId))
      .run();
  }

  private audit(
    environment: Environment,
    actor: Actor | undefined,
    productId: string,
    type: string,
    data: Record<string, unknown>,
  ): void {
    recordAudit(
      this.deps.db,
      this.deps,
      { actor: actor ?? { type: "system" }, environment, requestId: null },
      { type, target: { type: "product", id: productId }, data },
    );
  }

  private keyRow(keyId: string): SigningKeyRow | undefined {
    return this.deps.db.select().from(signingKeys).where(eq(signingKeys.keyId, keyId)).get();
  }

  /** Every signing key row of the product, whatever its status: the bundle's input. */
  keysOf(productId: string): SigningKeyRow[] {
    return this.deps.db.select().from(signingKeys).where(eq(signingKeys.productId, productId)).all();
  }
}
