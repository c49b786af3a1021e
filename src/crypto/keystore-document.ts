/**
 * The keystore's on-disk document and its cryptography: the JSON format, scrypt key derivation,
 * AES-256-GCM sealing of each entry and the whole-document MAC, and the checks a file read from
 * disk must pass. Apart from keystore.ts, which holds the Keystore class (the file's lifecycle,
 * locking and atomic writes), so the format can be read and reviewed on its own.
 */
import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  randomBytes,
  scryptSync,
  timingSafeEqual,
} from "node:crypto";
import { b64u } from "./encoding.ts";
import { canonicalize } from "./jcs.ts";

/**
 * The sealed keystore: one JSON file holding every private key and the data key.
 * passphrase -> scrypt -> (encryption key, MAC key). Each entry is AES-256-GCM with its metadata
 * as associated data, and an HMAC over the whole document catches removed or reordered entries.
 */
export const KEYSTORE_FORMAT = "licensing-keystore-v1";

export type KeystoreErrorReason = "missing" | "wrong_passphrase" | "tampered" | "malformed";

export class KeystoreError extends Error {
  constructor(
    readonly reason: KeystoreErrorReason,
    message: string,
  ) {
    super(message);
    this.name = "KeystoreError";
  }
}

export type EntryKind = "data_key" | "root_key" | "product_signing_key" | "online_key" | "sealing_key";

export interface EntryMetadata {
  id: string;
  kind: EntryKind;
  environment: "live" | "test" | null;
  alg: string;
  created_at: string;
}

export interface SealedEntry extends EntryMetadata {
  nonce: string;
  ciphertext: string;
}

export interface KdfParams {
  name: "scrypt";
  N: number;
  r: number;
  p: number;
  salt: string;
}

export interface KeystoreDocument {
  format: typeof KEYSTORE_FORMAT;
  kdf: KdfParams;
  check: { nonce: string; ciphertext: string };
  entries: SealedEntry[];
  mac: string;
}

export const DEFAULT_SCRYPT_N = 2 ** 16;
/** Tests lower the cost to 2^10; nothing above 2^17 (128 MiB of scrypt memory) is ever written. */
const MIN_SCRYPT_N = 2 ** 10;
const MAX_SCRYPT_N = 2 ** 17;

export interface DerivedKeys {
  encryption: Buffer;
  mac: Buffer;
}

export function deriveKeys(passphrase: string, kdf: KdfParams): DerivedKeys {
  const material = scryptSync(passphrase.normalize("NFC"), b64u.decode(kdf.salt), 64, {
    N: kdf.N,
    r: kdf.r,
    p: kdf.p,
    maxmem: 256 * kdf.N * kdf.r + 1024 * 1024,
  });
  return { encryption: material.subarray(0, 32), mac: material.subarray(32) };
}

export function seal(key: Buffer, plaintext: Uint8Array, aad: string): { nonce: string; ciphertext: string } {
  const nonce = randomBytes(12);
  const cipher = createCipheriv("aes-256-gcm", key, nonce);
  cipher.setAAD(Buffer.from(aad));
  const body = Buffer.concat([cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]);
  return { nonce: b64u.encode(nonce), ciphertext: b64u.encode(body) };
}

export function open(
  key: Buffer,
  sealed: { nonce: string; ciphertext: string },
  aad: string,
): Uint8Array | null {
  try {
    const body = Buffer.from(b64u.decode(sealed.ciphertext));
    if (body.length < 16) return null;
    const decipher = createDecipheriv("aes-256-gcm", key, Buffer.from(b64u.decode(sealed.nonce)));
    decipher.setAAD(Buffer.from(aad));
    decipher.setAuthTag(body.subarray(body.length - 16));
    return new Uint8Array(
      Buffer.concat([decipher.update(body.subarray(0, body.length - 16)), decipher.final()]),
    );
  } catch {
    return null;
  }
}

export const metadataOf = (entry: EntryMetadata): EntryMetadata => ({
  id: entry.id,
  kind: entry.kind,
  environment: entry.environment,
  alg: entry.alg,
  created_at: entry.created_at,
});

export const documentMac = (macKey: Buffer, doc: Omit<KeystoreDocument, "mac">): string =>
  b64u.encode(createHmac("sha256", macKey).update(canonicalize(doc)).digest());

/** Checks the whole-document MAC, then opens every entry with its metadata as associated data. */
export function verifiedSecrets(doc: KeystoreDocument, keys: DerivedKeys): Map<string, Uint8Array> {
  const { mac, ...rest } = doc;
  const expected = Buffer.from(documentMac(keys.mac, rest));
  const actual = Buffer.from(mac);
  if (expected.length !== actual.length || !timingSafeEqual(expected, actual)) {
    throw new KeystoreError(
      "tampered",
      "the keystore file has been modified outside the service; refusing it",
    );
  }
  const secrets = new Map<string, Uint8Array>();
  for (const entry of doc.entries) {
    const secret = open(keys.encryption, entry, canonicalize(metadataOf(entry)));
    if (!secret)
      throw new KeystoreError("tampered", `keystore entry ${entry.id} does not decrypt; refusing it`);
    secrets.set(entry.id, secret);
  }
  return secrets;
}

export function parseDocument(text: string): KeystoreDocument {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw new KeystoreError("malformed", "the keystore file is not valid JSON (truncated or corrupted)");
  }
  if (!isDocument(doc)) throw new KeystoreError("malformed", "the keystore file is not a licensing keystore");
  return doc;
}

function isDocument(doc: unknown): doc is KeystoreDocument {
  if (typeof doc !== "object" || doc === null) return false;
  const d = doc as Record<string, unknown>;
  const kdf = d.kdf as Record<string, unknown> | undefined;
  const check = d.check as Record<string, unknown> | undefined;
  return (
    d.format === KEYSTORE_FORMAT &&
    typeof kdf === "object" &&
    kdf !== null &&
    kdf.name === "scrypt" &&
    isAllowedKdf(kdf) &&
    typeof kdf.salt === "string" &&
    typeof check === "object" &&
    check !== null &&
    typeof check.nonce === "string" &&
    typeof check.ciphertext === "string" &&
    Array.isArray(d.entries) &&
    d.entries.every(isSealedEntry) &&
    typeof d.mac === "string"
  );
}

/**
 * Only the parameters this service writes: the file is read before its MAC can be checked, so a
 * tampered cost (r = 2^20, say) must not make start-up spend gigabytes and hang.
 */
export function isAllowedKdf(kdf: Record<string, unknown>): boolean {
  const n = kdf.N;
  return (
    kdf.r === 8 &&
    kdf.p === 1 &&
    typeof n === "number" &&
    Number.isInteger(n) &&
    n >= MIN_SCRYPT_N &&
    n <= MAX_SCRYPT_N &&
    (n & (n - 1)) === 0
  );
}

function isSealedEntry(entry: unknown): entry is SealedEntry {
  if (typeof entry !== "object" || entry === null) return false;
  const e = entry as Record<string, unknown>;
  return (
    ["id", "kind", "alg", "created_at", "nonce", "ciphertext"].every((k) => typeof e[k] === "string") &&
    (e.environment === null || e.environment === "live" || e.environment === "test")
  );
}
