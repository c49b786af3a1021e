import type { Database } from "bun:sqlite";
import { createPublicKey, generateKeyPairSync, hkdfSync, type KeyObject, randomBytes } from "node:crypto";
import { and, eq, sql } from "drizzle-orm";
import { type OnlineSigner, PREFIX, signDelegation } from "../../crypto/envelope.ts";
import { canonicalize } from "../../crypto/jcs.ts";
import {
  ed25519FromSeed,
  keyIdOf,
  privateKeyFromPkcs8,
  publicKeyText,
  signEd25519,
} from "../../crypto/keys.ts";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import { products, signingKeys, trustBundles } from "../../store/schema/index.ts";

/** Online keys rotate daily; each delegation is valid for two periods so rotation never leaves a gap. */
export const ONLINE_KEY_PERIOD_SEC = 86_400;
const DELEGATION_LIFETIME_SEC = 2 * ONLINE_KEY_PERIOD_SEC;
const ONLINE_MASTER_ID = "online-key-master";

export interface TrustBundleBody {
  v: 1;
  product_id: string;
  environment: Environment;
  sequence: number;
  issued_at: number;
  root_key_id: string;
  signing_keys: {
    key_id: string;
    public_key: string;
    status: "active" | "retired" | "compromised";
    not_before: number;
    not_after: number | null;
  }[];
}

export interface SignedTrustBundle {
  bundle: TrustBundleBody;
  root_signature: string;
}

interface RootKey {
  keyId: string;
  publicKey: string;
  privateKey: KeyObject;
}

/**
 * The key hierarchy of DESIGN §5: per-environment root keys sign trust bundles; each product's
 * signing keys sign certificates and delegations; online keys, derived per product and day from a
 * keystore secret, sign runtime responses. Bundles and delegations are made once and cached.
 */
type SigningKeyRow = typeof signingKeys.$inferSelect;
interface ActiveKeyMemo {
  dataVersion: number;
  /** Whether data_version was read in this turn of the event loop. */
  checkedThisTurn: boolean;
  rows: Map<string, SigningKeyRow>;
}
const activeKeyMemos = new WeakMap<Database, ActiveKeyMemo>();

export class TrustService {
  private readonly roots = new Map<Environment, RootKey>();
  private readonly signingKeyCache = new Map<string, KeyObject>();
  private readonly onlineSigners = new Map<string, OnlineSigner>();
  private readonly bundles = new Map<string, SignedTrustBundle>();
  private readonly onlineMaster: Uint8Array;
  /** Read on every signed response, so prepared once. */
  private readonly activeKey;
  /**
   * The active key row per product, remembered while no other connection has committed (SQLite's
   * `data_version`), so a key rotated from the command line is used at once, and forgotten on
   * every in-process write to signing keys. A heartbeat needs the row twice (certificate and
   * response); this makes it one cheap pragma instead of two row reads.
   */
  private readonly activeKeys: ActiveKeyMemo;
  private readonly dataVersion;

  constructor(private readonly deps: Deps) {
    this.activeKey = deps.db
      .select()
      .from(signingKeys)
      .where(and(eq(signingKeys.productId, sql.placeholder("productId")), eq(signingKeys.status, "active")))
      .prepare();
    this.dataVersion = deps.sqlite.prepare<{ data_version: number }, []>("PRAGMA data_version");
    // Shared by every TrustService on this connection: its writes are invisible to data_version.
    let memo = activeKeyMemos.get(deps.sqlite);
    if (!memo) {
      memo = { dataVersion: -1, checkedThisTurn: false, rows: new Map() };
      activeKeyMemos.set(deps.sqlite, memo);
    }
    this.activeKeys = memo;
    for (const environment of ["live", "test"] as const) {
      const privateKey = privateKeyFromPkcs8(deps.keystore.secret(`root-${environment}`));
      const publicKey = publicKeyText(createPublicKey(privateKey));
      this.roots.set(environment, { keyId: keyIdOf(publicKey), publicKey, privateKey });
    }
    if (!deps.keystore.has(ONLINE_MASTER_ID)) {
      deps.keystore.add([
        {
          metadata: {
            id: ONLINE_MASTER_ID,
            kind: "online_key",
            environment: null,
            alg: "hkdf-sha256",
            created_at: deps.clock.now().toISOString(),
          },
          secret: randomBytes(32),
        },
      ]);
    }
    this.onlineMaster = deps.keystore.secret(ONLINE_MASTER_ID);
  }

  root(environment: Environment): { keyId: string; publicKey: string } {
    const root = this.roots.get(environment);
    if (!root) throw new Error(`no root key for ${environment}`);
    return { keyId: root.keyId, publicKey: root.publicKey };
  }

  /**
   * Gives a product its first signing key and bundle. Safe to call again: a product that already
   * has an active key is left alone. On failure the product stays `pending` and is retried.
   */
  provision(productId: string): void {
    const product = this.deps.db.select().from(products).where(eq(products.id, productId)).get();
    if (!product || product.signingStatus === "ready") return;
    const existing = this.activeKeyRow(productId);
    if (!existing) this.addSigningKey(productId, product.environment);
    this.deps.db.update(products).set({ signingStatus: "ready" }).where(eq(products.id, productId)).run();
    this.rebuildBundle(productId);
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
   * A new active signing key; the previous one is retired and stays in the bundle until
   * `retainSec` from now (the longest certificate it may have signed), then drops out.
   */
  rotate(productId: string, retainSec: number): string {
    const product = this.deps.db.select().from(products).where(eq(products.id, productId)).get();
    if (!product) throw ApiError.notFound("product");
    const previous = this.activeKeyRow(productId);
    const keyId = this.addSigningKey(productId, product.environment);
    if (previous) this.retire(previous.keyId, retainSec, { rebuild: false });
    this.deps.db.update(products).set({ signingStatus: "ready" }).where(eq(products.id, productId)).run();
    this.rebuildBundle(productId);
    return keyId;
  }

  /** Retires a key; `compromised` keys stay listed so devices refuse what they signed. */
  retire(
    keyId: string,
    retainSec: number,
    options: { rebuild: boolean; compromised?: boolean } = { rebuild: true },
  ): void {
    const row = this.deps.db.select().from(signingKeys).where(eq(signingKeys.keyId, keyId)).get();
    if (!row) throw new Error(`no signing key ${keyId}`);
    const now = this.deps.clock.now();
    this.activeKeys.rows.clear();
    this.deps.db
      .update(signingKeys)
      .set({
        status: options.compromised ? "compromised" : "retired",
        notAfter: options.compromised ? unixSeconds(now) : unixSeconds(now) + retainSec,
        retiredAt: now,
      })
      .where(eq(signingKeys.keyId, keyId))
      .run();
    for (const key of this.onlineSigners.keys())
      if (key.startsWith(`${row.productId}|`)) this.onlineSigners.delete(key);
    if (options.rebuild) this.rebuildBundle(row.productId);
  }

  /** The signed bundle devices fetch; 409 while the product has no signing key yet. */
  bundle(productId: string): SignedTrustBundle {
    const row = this.deps.db.select().from(trustBundles).where(eq(trustBundles.productId, productId)).get();
    if (!row) throw signingPending(productId);
    const cacheKey = `${productId}|${row.sequence}`;
    let signed = this.bundles.get(cacheKey);
    if (!signed) {
      signed = { bundle: JSON.parse(row.bundle) as TrustBundleBody, root_signature: row.rootSignature };
      this.bundles.set(cacheKey, signed);
    }
    return signed;
  }

  /** True when the product has an active signing key (so it exists); answered from the memo. */
  hasActiveKey(productId: string): boolean {
    return this.activeKeyRow(productId) !== undefined;
  }

  /** The product's active signing key, for certificates and offline packages. */
  signingKey(productId: string): { keyId: string; privateKey: KeyObject; notBefore: number } {
    const row = this.activeKeyRow(productId);
    if (!row) throw signingPending(productId);
    let privateKey = this.signingKeyCache.get(row.keyId);
    if (!privateKey) {
      const entry = `product-signing:${row.keyId}`;
      // A key rotated from the command line is in the file, not yet in this process's copy.
      if (!this.deps.keystore.has(entry)) this.deps.keystore.refresh();
      privateKey = privateKeyFromPkcs8(this.deps.keystore.secret(entry));
      this.signingKeyCache.set(row.keyId, privateKey);
    }
    return { keyId: row.keyId, privateKey, notBefore: row.notBefore };
  }

  /**
   * The online key of this product for the current period, with its delegation. Derived from the
   * keystore's online-key secret, so nothing is written when it rotates and every process agrees.
   */
  onlineSigner(productId: string, now: Date): OnlineSigner {
    const parent = this.signingKey(productId);
    const epoch = Math.floor(unixSeconds(now) / ONLINE_KEY_PERIOD_SEC);
    const cacheKey = `${productId}|${parent.keyId}|${epoch}`;
    const cached = this.onlineSigners.get(cacheKey);
    if (cached) return cached;
    const seed = new Uint8Array(
      hkdfSync("sha256", this.onlineMaster, "", `online-key\n${productId}\n${parent.keyId}\n${epoch}`, 32),
    );
    const privateKey = ed25519FromSeed(seed);
    const publicKey = publicKeyText(createPublicKey(privateKey));
    // Issued within the parent's validity: a key created mid-period vouches only from its birth.
    const issuedAt = Math.max(epoch * ONLINE_KEY_PERIOD_SEC, parent.notBefore);
    const signer: OnlineSigner = {
      productId,
      keyId: keyIdOf(publicKey),
      parentKeyId: parent.keyId,
      privateKey,
      delegation: signDelegation(
        {
          v: 1,
          purpose: "runtime-response",
          product_id: productId,
          parent_key_id: parent.keyId,
          online_key_id: keyIdOf(publicKey),
          public_key: publicKey,
          issued_at: issuedAt,
          expires_at: epoch * ONLINE_KEY_PERIOD_SEC + DELEGATION_LIFETIME_SEC,
        },
        parent.privateKey,
      ),
    };
    for (const key of this.onlineSigners.keys())
      if (key.startsWith(`${productId}|`)) this.onlineSigners.delete(key);
    this.onlineSigners.set(cacheKey, signer);
    return signer;
  }

  /** Signs and stores the bundle of the product's current keys under the next sequence number. */
  rebuildBundle(productId: string): SignedTrustBundle {
    return this.deps.db.transaction((tx) => {
      const product = tx.select().from(products).where(eq(products.id, productId)).get();
      if (!product) throw new Error(`no product ${productId}`);
      const now = this.deps.clock.now();
      const nowSec = unixSeconds(now);
      const root = this.roots.get(product.environment);
      if (!root) throw new Error(`no root key for ${product.environment}`);
      const keys = tx
        .select()
        .from(signingKeys)
        .where(eq(signingKeys.productId, productId))
        .all()
        .filter((k) => k.status !== "retired" || (k.notAfter ?? Number.POSITIVE_INFINITY) > nowSec)
        .sort((a, b) => a.notBefore - b.notBefore || (a.keyId < b.keyId ? -1 : 1));
      const sequence = product.trustBundleSequence + 1;
      const bundle: TrustBundleBody = {
        v: 1,
        product_id: productId,
        environment: product.environment,
        sequence,
        issued_at: nowSec,
        root_key_id: root.keyId,
        signing_keys: keys.map((k) => ({
          key_id: k.keyId,
          public_key: k.publicKey,
          status: k.status,
          not_before: k.notBefore,
          not_after: k.notAfter,
        })),
      };
      const text = canonicalize(bundle);
      const rootSignature = signEd25519(root.privateKey, PREFIX.trustBundle + text);
      tx.update(products).set({ trustBundleSequence: sequence }).where(eq(products.id, productId)).run();
      tx.insert(trustBundles)
        .values({ productId, sequence, bundle: text, rootSignature, issuedAt: now })
        .onConflictDoUpdate({
          target: trustBundles.productId,
          set: { sequence, bundle: text, rootSignature, issuedAt: now },
        })
        .run();
      return { bundle, root_signature: rootSignature };
    });
  }

  /** Retired keys whose retention has passed drop out of their bundles. */
  pruneExpiredKeys(): number {
    const nowSec = unixSeconds(this.deps.clock.now());
    const stale = this.deps.db
      .select({ productId: trustBundles.productId, bundle: trustBundles.bundle })
      .from(trustBundles)
      .all()
      .filter(({ bundle }) =>
        (JSON.parse(bundle) as TrustBundleBody).signing_keys.some(
          (k) => k.status === "retired" && k.not_after !== null && k.not_after <= nowSec,
        ),
      );
    for (const { productId } of stale) this.rebuildBundle(productId);
    return stale.length;
  }

  signingKeyRow(keyId: string) {
    return this.deps.db.select().from(signingKeys).where(eq(signingKeys.keyId, keyId)).get();
  }

  signingKeys(productId: string) {
    return this.deps.db.select().from(signingKeys).where(eq(signingKeys.productId, productId)).all();
  }

  private activeKeyRow(productId: string) {
    const memo = this.activeKeys;
    // Asked once per turn of the event loop: the pragma costs a few µs, and a heartbeat, its
    // response and the other calls of a shared commit (group-commit.ts) all ask within one turn.
    if (!memo.checkedThisTurn) {
      memo.checkedThisTurn = true;
      setImmediate(() => {
        memo.checkedThisTurn = false;
      });
      const version = this.dataVersion.get()?.data_version ?? -1;
      if (version !== memo.dataVersion) {
        memo.rows.clear();
        memo.dataVersion = version;
      }
    }
    const remembered = memo.rows.get(productId);
    if (remembered) return remembered;
    const row = this.activeKey.get({ productId });
    // Remember only what exists: a missing key is the rare pending state, re-read until it is made.
    if (row) memo.rows.set(productId, row);
    return row;
  }

  /** Keystore first, then the store: a crash in between leaves an unused key, never a key-less row. */
  private addSigningKey(productId: string, environment: Environment): string {
    const { privateKey, publicKey } = generateKeyPairSync("ed25519");
    const text = publicKeyText(publicKey);
    const keyId = keyIdOf(text);
    const now = this.deps.clock.now();
    this.deps.keystore.add([
      {
        metadata: {
          id: `product-signing:${keyId}`,
          kind: "product_signing_key",
          environment,
          alg: "ed25519",
          created_at: now.toISOString(),
        },
        secret: new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" })),
      },
    ]);
    this.deps.db
      .insert(signingKeys)
      .values({
        keyId,
        productId,
        publicKey: text,
        status: "active",
        notBefore: unixSeconds(now),
        notAfter: null,
        createdAt: now,
      })
      .run();
    this.activeKeys.rows.clear();
    this.signingKeyCache.set(keyId, privateKey);
    return keyId;
  }
}

export const signingPending = (productId: string) =>
  new ApiError(
    "SIGNING_KEY_PENDING",
    "The product's signing keys are not ready yet; retry shortly.",
    {
      product_id: productId,
    },
    { retryable: true },
  );
