import type { KeyObject } from "node:crypto";
import { PREFIX } from "../../crypto/envelope.ts";
import { canonicalize } from "../../crypto/jcs.ts";
import { signEd25519 } from "../../crypto/keys.ts";
import type { Environment } from "../../domain/scopes.ts";
import type { signingKeys } from "../../store/schema/index.ts";

export interface TrustBundleBody {
  v: 1;
  product_id: string;
  environment: Environment;
  sequence: number;
  issued_at: number;
  root_key_id: string;
  signing_keys: BundleKey[];
}

export interface BundleKey {
  key_id: string;
  public_key: string;
  status: "active" | "retired" | "compromised";
  not_before: number;
  not_after: number | null;
}

export interface SignedTrustBundle {
  bundle: TrustBundleBody;
  root_signature: string;
}

export type SigningKeyRow = typeof signingKeys.$inferSelect;

/**
 * The keys a bundle built at `nowSec` lists (protocol §4): every key but the retired ones whose
 * retention has passed, ordered by `not_before`, then `key_id`.
 */
export function listedKeys(rows: readonly SigningKeyRow[], nowSec: number): BundleKey[] {
  return rows
    .filter((k) => k.status !== "retired" || (k.notAfter ?? Number.POSITIVE_INFINITY) > nowSec)
    .sort((a, b) => a.notBefore - b.notBefore || (a.keyId < b.keyId ? -1 : 1))
    .map((k) => ({
      key_id: k.keyId,
      public_key: k.publicKey,
      status: k.status,
      not_before: k.notBefore,
      not_after: k.notAfter,
    }));
}

/** The bundle body, its JCS text (what is stored, exactly as signed) and the root's signature. */
export function signBundle(
  body: Omit<TrustBundleBody, "v">,
  root: KeyObject,
): { bundle: TrustBundleBody; text: string; rootSignature: string } {
  const bundle: TrustBundleBody = { v: 1, ...body };
  const text = canonicalize(bundle);
  return { bundle, text, rootSignature: signEd25519(root, PREFIX.trustBundle + text) };
}

/**
 * True when a stored bundle no longer says what the key rows say: a retired key past its
 * retention, or a key missing, extra or listed with another status or `not_after` (a change whose
 * rebuild never committed, as a rotation by an older version could leave). Such a bundle must
 * be rebuilt, or devices refuse the active key or keep trusting a compromised one.
 */
export function bundleIsStale(
  stored: TrustBundleBody,
  rows: readonly SigningKeyRow[],
  nowSec: number,
): boolean {
  const want = listedKeys(rows, nowSec);
  const have = stored.signing_keys;
  if (want.length !== have.length) return true;
  return want.some((k, i) => {
    const listed = have[i];
    return (
      listed === undefined ||
      listed.key_id !== k.key_id ||
      listed.status !== k.status ||
      listed.not_after !== k.not_after
    );
  });
}

/**
 * True when `next` lists a key as compromised that `previous` did not: every bundle before `next`
 * would still trust that key, so none of them is safe to accept any more (the integration config's
 * minimum moves up to `next`). Rotations and retired keys dropping out do not count: an older
 * bundle that still lists an uncompromised retired key trusts nothing an attacker holds.
 */
export function newlyCompromised(previous: TrustBundleBody | undefined, next: readonly BundleKey[]): boolean {
  const before = new Set(
    (previous?.signing_keys ?? []).filter((k) => k.status === "compromised").map((k) => k.key_id),
  );
  return next.some((k) => k.status === "compromised" && !before.has(k.key_id));
}
