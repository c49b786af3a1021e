import type { Database } from "bun:sqlite";
import { createPublicKey, hkdfSync, type KeyObject, randomBytes } from "node:crypto";
import { and, eq, sql } from "drizzle-orm";
import { type OnlineSigner, signDelegation } from "../../crypto/envelope.ts";
import { ed25519FromSeed, keyIdOf, privateKeyFromPkcs8, publicKeyText } from "../../crypto/keys.ts";
import { productSigningEntryId } from "../../crypto/keystore.ts";
import type { Deps } from "../../deps.ts";
import { unixSeconds } from "../../domain/clock.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError } from "../../http/errors.ts";
import type { Actor } from "../../store/schema/audit.ts";
import { signingKeys, trustBundles } from "../../store/schema/index.ts";
import type { SignedTrustBundle, SigningKeyRow, TrustBundleBody } from "./bundle.ts";
import { KeyLifecycle, type Retirement, type Rotation } from "./lifecycle.ts";

export type { SignedTrustBundle, TrustBundleBody } from "./bundle.ts";
export { type Retirement, type Rotation, SigningKeyError } from "./lifecycle.ts";

/** Online keys rotate daily; each delegation is valid for two periods so rotation never leaves a gap. */
export const ONLINE_KEY_PERIOD_SEC = 86_400;
const DELEGATION_LIFETIME_SEC = 2 * ONLINE_KEY_PERIOD_SEC;
export const ONLINE_MASTER_ID = "online-key-master";

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
  private readonly lifecycle: KeyLifecycle;

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
    // The first process to need it makes it; one started at the same moment reads the same one.
    this.onlineMaster = deps.keystore.ensure(ONLINE_MASTER_ID, () => ({
      metadata: {
        id: ONLINE_MASTER_ID,
        kind: "online_key",
        environment: null,
        alg: "hkdf-sha256",
        created_at: deps.clock.now().toISOString(),
      },
      secret: randomBytes(32),
    }));
    this.lifecycle = new KeyLifecycle(deps, {
      rootKey: (environment) => {
        const root = this.roots.get(environment);
        if (!root) throw new Error(`no root key for ${environment}`);
        return root;
      },
      forget: (productId) => {
        this.activeKeys.rows.clear();
        for (const key of this.onlineSigners.keys())
          if (key.startsWith(`${productId}|`)) this.onlineSigners.delete(key);
      },
      remember: (keyId, privateKey) => this.signingKeyCache.set(keyId, privateKey),
    });
  }

  root(environment: Environment): { keyId: string; publicKey: string } {
    const root = this.roots.get(environment);
    if (!root) throw new Error(`no root key for ${environment}`);
    return { keyId: root.keyId, publicKey: root.publicKey };
  }

  /** Signing-key changes (lifecycle.ts): each is one write transaction with its bundle and audit record. */
  provision(productId: string): void {
    this.lifecycle.provision(productId);
  }

  provisionPending(): number {
    return this.lifecycle.provisionPending();
  }

  rotate(productId: string, options: { retainSec?: number; actor?: Actor } = {}): Rotation {
    return this.lifecycle.rotate(productId, options);
  }

  retire(keyId: string, options: { compromised?: boolean; actor?: Actor } = {}): Retirement {
    return this.lifecycle.retire(keyId, options);
  }

  rebuildBundle(productId: string): SignedTrustBundle {
    return this.lifecycle.rebuildBundle(productId);
  }

  pruneExpiredKeys(): number {
    return this.lifecycle.pruneExpiredKeys();
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
      const entry = productSigningEntryId(row.keyId);
      // A key rotated from the command line is in the file, not yet in this process's copy.
      if (!this.deps.keystore.has(entry)) this.deps.keystore.refresh();
      privateKey = privateKeyFromPkcs8(this.deps.keystore.secret(entry));
      this.signingKeyCache.set(row.keyId, privateKey);
    }
    return { keyId: row.keyId, privateKey, notBefore: row.notBefore };
  }

  /**
   * The signing key as committed, not as remembered this turn: for work under a write lock whose
   * output must agree with the key rows. An offline package signed with a key another process
   * retired a moment ago would outlive the retention that rotation computed under the same lock.
   */
  committedSigningKey(productId: string): { keyId: string; privateKey: KeyObject; notBefore: number } {
    this.activeKeys.rows.delete(productId);
    return this.signingKey(productId);
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

  /** Every signing key row of the product, whatever its status (the command line's list). */
  signingKeys(productId: string): SigningKeyRow[] {
    return this.lifecycle.keysOf(productId);
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
