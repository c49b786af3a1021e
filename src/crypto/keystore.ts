import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  generateKeyPairSync,
  randomBytes,
  scryptSync,
  timingSafeEqual,
} from "node:crypto";
import {
  closeSync,
  existsSync,
  fsyncSync,
  openSync,
  readFileSync,
  renameSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { dirname } from "node:path";
import { b64u } from "./encoding.ts";
import { withLock } from "./file-lock.ts";
import { canonicalize } from "./jcs.ts";

/**
 * The sealed keystore: one JSON file holding every private key and the data key.
 * passphrase -> scrypt -> (encryption key, MAC key). Each entry is AES-256-GCM with its metadata
 * as associated data, and an HMAC over the whole document catches removed or reordered entries.
 */
export const KEYSTORE_FORMAT = "licensing-keystore-v1";
const CHECK_PLAINTEXT = "licensing keystore passphrase check";

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

/** Entry ids of product signing keys' private halves (kind `product_signing_key`): the prefix + key id. */
export const PRODUCT_SIGNING_PREFIX = "product-signing:";
export const productSigningEntryId = (keyId: string): string => `${PRODUCT_SIGNING_PREFIX}${keyId}`;

/** Entry ids of sealing keys' private halves (kind `sealing_key`): the prefix + key id. */
export const PRODUCT_SEALING_PREFIX = "product-sealing:";

export interface EntryMetadata {
  id: string;
  kind: EntryKind;
  environment: "live" | "test" | null;
  alg: string;
  created_at: string;
}

interface SealedEntry extends EntryMetadata {
  nonce: string;
  ciphertext: string;
}

interface KdfParams {
  name: "scrypt";
  N: number;
  r: number;
  p: number;
  salt: string;
}

interface KeystoreDocument {
  format: typeof KEYSTORE_FORMAT;
  kdf: KdfParams;
  check: { nonce: string; ciphertext: string };
  entries: SealedEntry[];
  mac: string;
}

export interface CreateOptions {
  /** scrypt cost; tests lower it so each fresh keystore takes milliseconds. */
  scryptN?: number;
  now?: Date;
}

const DEFAULT_SCRYPT_N = 2 ** 16;
/** Tests lower the cost to 2^10; nothing above 2^17 (128 MiB of scrypt memory) is ever written. */
const MIN_SCRYPT_N = 2 ** 10;
const MAX_SCRYPT_N = 2 ** 17;

interface DerivedKeys {
  encryption: Buffer;
  mac: Buffer;
}

function deriveKeys(passphrase: string, kdf: KdfParams): DerivedKeys {
  const material = scryptSync(passphrase.normalize("NFC"), b64u.decode(kdf.salt), 64, {
    N: kdf.N,
    r: kdf.r,
    p: kdf.p,
    maxmem: 256 * kdf.N * kdf.r + 1024 * 1024,
  });
  return { encryption: material.subarray(0, 32), mac: material.subarray(32) };
}

function seal(key: Buffer, plaintext: Uint8Array, aad: string): { nonce: string; ciphertext: string } {
  const nonce = randomBytes(12);
  const cipher = createCipheriv("aes-256-gcm", key, nonce);
  cipher.setAAD(Buffer.from(aad));
  const body = Buffer.concat([cipher.update(plaintext), cipher.final(), cipher.getAuthTag()]);
  return { nonce: b64u.encode(nonce), ciphertext: b64u.encode(body) };
}

function open(key: Buffer, sealed: { nonce: string; ciphertext: string }, aad: string): Uint8Array | null {
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

const metadataOf = (entry: EntryMetadata): EntryMetadata => ({
  id: entry.id,
  kind: entry.kind,
  environment: entry.environment,
  alg: entry.alg,
  created_at: entry.created_at,
});

const documentMac = (macKey: Buffer, doc: Omit<KeystoreDocument, "mac">): string =>
  b64u.encode(createHmac("sha256", macKey).update(canonicalize(doc)).digest());

export class Keystore {
  private constructor(
    readonly path: string,
    private readonly keys: DerivedKeys,
    private readonly kdf: KdfParams,
    private readonly check: { nonce: string; ciphertext: string },
    private sealed: SealedEntry[],
    private readonly secrets: Map<string, Uint8Array>,
  ) {}

  /** A new keystore with a data key and one root key per environment. Refuses to overwrite. */
  static create(path: string, passphrase: string, options: CreateOptions = {}): Keystore {
    if (existsSync(path)) throw new KeystoreError("malformed", `a keystore already exists at ${path}`);
    const N = options.scryptN ?? DEFAULT_SCRYPT_N;
    if (!isAllowedKdf({ N, r: 8, p: 1 })) {
      throw new KeystoreError("malformed", "scrypt N must be a power of two from 2^10 to 2^17");
    }
    const kdf: KdfParams = {
      name: "scrypt",
      N,
      r: 8,
      p: 1,
      salt: b64u.encode(randomBytes(16)),
    };
    const keys = deriveKeys(passphrase, kdf);
    const check = seal(keys.encryption, Buffer.from(CHECK_PLAINTEXT), KEYSTORE_FORMAT);
    const store = new Keystore(path, keys, kdf, check, [], new Map());
    const createdAt = (options.now ?? new Date()).toISOString();
    store.stage(
      { id: "data-key", kind: "data_key", environment: null, alg: "aes-256", created_at: createdAt },
      randomBytes(32),
    );
    for (const environment of ["live", "test"] as const) {
      store.stage(
        { id: `root-${environment}`, kind: "root_key", environment, alg: "ed25519", created_at: createdAt },
        ed25519PrivateKeyDer(),
      );
    }
    store.persist();
    return store;
  }

  static open(path: string, passphrase: string): Keystore {
    if (!existsSync(path))
      throw new KeystoreError("missing", `no keystore at ${path}; run "licensing init" first`);
    const doc = parseDocument(readFileSync(path, "utf8"));
    const keys = deriveKeys(passphrase, doc.kdf);
    const check = open(keys.encryption, doc.check, KEYSTORE_FORMAT);
    if (!check || Buffer.from(check).toString() !== CHECK_PLAINTEXT) {
      throw new KeystoreError("wrong_passphrase", "the keystore passphrase is wrong");
    }
    return new Keystore(path, keys, doc.kdf, doc.check, doc.entries, verifiedSecrets(doc, keys));
  }

  /**
   * Re-reads the file after another process (the command line) added entries: the same keys
   * still open it, so no scrypt runs. Refuses a file sealed under other keys or tampered with.
   */
  refresh(): void {
    const doc = parseDocument(readFileSync(this.path, "utf8"));
    if (doc.kdf.salt !== this.kdf.salt)
      throw new KeystoreError("tampered", "the keystore was replaced by another one");
    const secrets = verifiedSecrets(doc, this.keys);
    this.sealed = doc.entries;
    this.secrets.clear();
    for (const [id, secret] of secrets) this.secrets.set(id, secret);
  }

  entries(): EntryMetadata[] {
    return this.sealed.map(metadataOf);
  }

  secret(id: string): Uint8Array {
    const value = this.secrets.get(id);
    if (!value) throw new KeystoreError("missing", `keystore has no entry ${id}`);
    return value;
  }

  has(id: string): boolean {
    return this.secrets.has(id);
  }

  /** Adds entries and rewrites the file atomically; on failure the old file and state stay. */
  add(items: { metadata: EntryMetadata; secret: Uint8Array }[]): void {
    // The server and the command line both add entries: under the lock, start from the file as
    // it is now, so neither overwrites what the other just wrote.
    withLock(
      `${this.path}.lock`,
      () => {
        if (existsSync(this.path)) this.refresh();
        const previous = [...this.sealed];
        const staged: string[] = [];
        try {
          for (const item of items) {
            this.stage(item.metadata, item.secret);
            staged.push(item.metadata.id);
          }
          this.persist();
        } catch (error) {
          // Forget only what this call added: an id that clashed belongs to an entry we must keep.
          for (const id of staged) this.secrets.delete(id);
          this.sealed = previous;
          throw error;
        }
      },
      () => new KeystoreError("malformed", `the keystore is locked by another process (${this.path}.lock)`),
    );
  }

  /**
   * The entry `id`, added from `make()` unless the file holds one already: for entries any process
   * may be the first to need (the online key master). Checked under the lock against the file as
   * it is now, so a server and a command started together both end up with the one entry, where
   * `add` would refuse the second as existing. Answers the entry's secret.
   */
  ensure(id: string, make: () => { metadata: EntryMetadata; secret: Uint8Array }): Uint8Array {
    if (!this.secrets.has(id)) {
      withLock(
        `${this.path}.lock`,
        () => {
          if (existsSync(this.path)) this.refresh();
          if (this.secrets.has(id)) return;
          const item = make();
          if (item.metadata.id !== id) throw new Error(`ensure(${id}) was given entry ${item.metadata.id}`);
          const previous = [...this.sealed];
          try {
            this.stage(item.metadata, item.secret);
            this.persist();
          } catch (error) {
            this.secrets.delete(id);
            this.sealed = previous;
            throw error;
          }
        },
        () => new KeystoreError("malformed", `the keystore is locked by another process (${this.path}.lock)`),
      );
    }
    return this.secret(id);
  }

  /**
   * Removes entries for good and rewrites the file atomically, under the same lock as `add`, from
   * the file as it is now. Only for keys the store has already given up (a compromised sealing
   * key): the caller commits that first, so a crash in between leaves a key that is still held
   * but never used, never a store row that needs a key the keystore lost. Answers the ids that
   * were there; absent ones are not an error, so a repeated removal completes an interrupted one.
   */
  remove(ids: readonly string[]): string[] {
    return withLock(
      `${this.path}.lock`,
      () => {
        this.refresh();
        const removed = ids.filter((id) => this.secrets.has(id));
        if (removed.length === 0) return removed;
        const previous = this.sealed;
        this.sealed = previous.filter((entry) => !removed.includes(entry.id));
        try {
          this.persist();
        } catch (error) {
          this.sealed = previous;
          throw error;
        }
        for (const id of removed) {
          this.secrets.get(id)?.fill(0);
          this.secrets.delete(id);
        }
        return removed;
      },
      () => new KeystoreError("malformed", `the keystore is locked by another process (${this.path}.lock)`),
    );
  }

  private stage(metadata: EntryMetadata, secret: Uint8Array): void {
    if (this.secrets.has(metadata.id))
      throw new KeystoreError("malformed", `keystore entry ${metadata.id} exists`);
    const sealed = seal(this.keys.encryption, secret, canonicalize(metadataOf(metadata)));
    this.sealed.push({ ...metadataOf(metadata), ...sealed });
    this.secrets.set(metadata.id, secret);
  }

  /** temp file -> fsync -> read back and verify -> rename -> fsync the directory. */
  private persist(): void {
    const body = { format: KEYSTORE_FORMAT, kdf: this.kdf, check: this.check, entries: this.sealed } as const;
    const doc: KeystoreDocument = { ...body, mac: documentMac(this.keys.mac, body) };
    const text = `${JSON.stringify(doc, null, 2)}\n`;
    const temp = `${this.path}.tmp-${process.pid}`;
    const fd = openSync(temp, "w", 0o600);
    try {
      writeSync(fd, text);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    try {
      if (readFileSync(temp, "utf8") !== text)
        throw new KeystoreError("malformed", "keystore write did not verify");
      renameSync(temp, this.path);
    } catch (error) {
      if (existsSync(temp)) unlinkSync(temp);
      throw error;
    }
    const dirFd = openSync(dirname(this.path), "r");
    try {
      fsyncSync(dirFd);
    } finally {
      closeSync(dirFd);
    }
  }
}

/** Checks the whole-document MAC, then opens every entry with its metadata as associated data. */
function verifiedSecrets(doc: KeystoreDocument, keys: DerivedKeys): Map<string, Uint8Array> {
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

function ed25519PrivateKeyDer(): Uint8Array {
  const { privateKey } = generateKeyPairSync("ed25519");
  return new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" }));
}

function parseDocument(text: string): KeystoreDocument {
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
function isAllowedKdf(kdf: Record<string, unknown>): boolean {
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
