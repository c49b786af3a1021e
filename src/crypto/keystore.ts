/**
 * The sealed keystore's lifecycle: creating, opening and re-reading the file, and adding, ensuring
 * and removing entries under a lock with atomic writes. The document format and its cryptography
 * are in keystore-document.ts.
 */
import { generateKeyPairSync, randomBytes } from "node:crypto";
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
import {
  DEFAULT_SCRYPT_N,
  type DerivedKeys,
  deriveKeys,
  documentMac,
  type EntryMetadata,
  isAllowedKdf,
  type KdfParams,
  KEYSTORE_FORMAT,
  type KeystoreDocument,
  KeystoreError,
  metadataOf,
  open,
  parseDocument,
  type SealedEntry,
  seal,
  verifiedSecrets,
} from "./keystore-document.ts";

export {
  type EntryKind,
  type EntryMetadata,
  KEYSTORE_FORMAT,
  KeystoreError,
  type KeystoreErrorReason,
} from "./keystore-document.ts";

const CHECK_PLAINTEXT = "licensing keystore passphrase check";

/** Entry ids of product signing keys' private halves (kind `product_signing_key`): the prefix + key id. */
export const PRODUCT_SIGNING_PREFIX = "product-signing:";
export const productSigningEntryId = (keyId: string): string => `${PRODUCT_SIGNING_PREFIX}${keyId}`;

/** Entry ids of sealing keys' private halves (kind `sealing_key`): the prefix + key id. */
export const PRODUCT_SEALING_PREFIX = "product-sealing:";

export interface CreateOptions {
  /** scrypt cost; tests lower it so each fresh keystore takes milliseconds. */
  scryptN?: number;
  now?: Date;
}

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
    // An entry gone from the file was removed for good by another process (a compromised key):
    // its private half leaves this process's memory too, as `remove` does here.
    for (const [id, secret] of this.secrets) if (!secrets.has(id)) secret.fill(0);
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

function ed25519PrivateKeyDer(): Uint8Array {
  const { privateKey } = generateKeyPairSync("ed25519");
  return new Uint8Array(privateKey.export({ format: "der", type: "pkcs8" }));
}
