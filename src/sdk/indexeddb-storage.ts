import type { Storage } from "./storage.ts";

const STORE = "entries";

/** The part of Web Storage an import reads (window.localStorage has it). */
export interface EnumerableWebStorage {
  readonly length: number;
  key(index: number): string | null;
  getItem(key: string): string | null;
}

/** The SDK's keys in any storage: every item it stores starts so (ClientState's prefix). */
const SDK_KEY_PREFIX = "svc.v1.";

export interface IndexedDbStorageOptions {
  /** The database's name; one per app (several clients share it through their `prefix`). */
  name?: string;
  /** The IndexedDB to use; `globalThis.indexedDB` when left out. */
  factory?: IDBFactory;
  /**
   * An app moving from `LocalStorageAdapter`: pass `window.localStorage`. While the database holds
   * nothing yet, the SDK's entries found there (device keys, activation, certificate, ...) are
   * copied in, in one transaction, so the device stays the one it was. Nothing is copied into a
   * database that holds anything, and `localStorage` is left as it was.
   */
  importFrom?: EnumerableWebStorage;
  /**
   * How long opening the database may take before it fails (default 10 s). Some browsers leave
   * an open pending for good (older Safari on a page's first open, a profile whose storage is
   * stuck); without a bound every call of the client would wait forever instead of failing into
   * the app's fallback. `Infinity` waits as long as the platform does.
   */
  openTimeoutMs?: number;
}

const DEFAULT_OPEN_TIMEOUT_MS = 10_000;

/**
 * IndexedDB, for web apps that may be open in several tabs. Unlike `localStorage`, IndexedDB is
 * one store for every tab of the origin: a write resolves once its transaction has committed, and
 * a read begun after that sees it, whichever tab reads. With the SDK's Web Lock around first-run
 * key generation and the check before an activation is stored, two tabs therefore agree on one
 * key pair (docs/sdk.md, "Clients sharing storage"). Writes ask for strict durability: the device
 * keys must outlive a crash, or the device's machine slot is held by keys nothing has any more.
 */
export class IndexedDbStorage implements Storage {
  private connection: Promise<IDBDatabase> | undefined;
  /** The connection opened last, so a stale one's close event does not drop a newer one. */
  private current: IDBDatabase | undefined;

  private constructor(
    private readonly name: string,
    private readonly factory: IDBFactory,
    private readonly openTimeoutMs: number,
  ) {}

  /** Opens (creating when needed) the database; fails when the platform has no IndexedDB. */
  static async open(options: IndexedDbStorageOptions = {}): Promise<IndexedDbStorage> {
    const factory = options.factory ?? (globalThis as { indexedDB?: IDBFactory }).indexedDB;
    if (!factory) throw new Error("IndexedDB is not available on this platform");
    const name = options.name ?? "licensing-sdk";
    const openTimeoutMs = options.openTimeoutMs ?? DEFAULT_OPEN_TIMEOUT_MS;
    if (!(openTimeoutMs > 0)) throw new RangeError("openTimeoutMs must be a positive number of milliseconds");
    const storage = new IndexedDbStorage(name, factory, openTimeoutMs);
    const database = await storage.database();
    // A database of that name made by other code: writing into it would fail at every call.
    if (!database.objectStoreNames.contains(STORE)) {
      await storage.close();
      throw new Error(
        `the IndexedDB database "${name}" has no "${STORE}" store: it is not the SDK's; pass another name`,
      );
    }
    if (options.importFrom) await storage.importIfEmpty(options.importFrom);
    return storage;
  }

  async get(key: string): Promise<string | undefined> {
    const value = await this.run("readonly", (store) => store.get(key));
    // Anything but a string was not written by this adapter: as absent, like an unknown key.
    return typeof value === "string" ? value : undefined;
  }

  async set(key: string, value: string): Promise<void> {
    await this.run("readwrite", (store) => store.put(value, key));
  }

  async delete(key: string): Promise<void> {
    await this.run("readwrite", (store) => store.delete(key));
  }

  /**
   * Copies the SDK's entries of `source` when the store is empty; the check and the copy are one
   * transaction, so two tabs opening at once copy once, and never over what a tab wrote first.
   */
  private async importIfEmpty(source: EnumerableWebStorage): Promise<void> {
    const entries: [string, string][] = [];
    for (let i = 0; i < source.length; i++) {
      const key = source.key(i);
      const value = key?.startsWith(SDK_KEY_PREFIX) ? source.getItem(key) : null;
      if (key && value !== null) entries.push([key, value]);
    }
    if (entries.length === 0) return;
    await this.run("readwrite", (store) => {
      const counted = store.count();
      counted.onsuccess = () => {
        if (counted.result === 0) for (const [key, value] of entries) store.put(value, key);
      };
      return counted;
    });
  }

  /** Closes the connection; a later call opens it again. */
  async close(): Promise<void> {
    const open = this.connection;
    this.forget();
    if (open) (await open).close();
  }

  /**
   * One request in a transaction of its own, answered once the transaction has completed: for a
   * write, once it is committed and visible to every tab; an aborted one (a full quota) rejects.
   */
  private async run(
    mode: IDBTransactionMode,
    request: (store: IDBObjectStore) => IDBRequest,
  ): Promise<unknown> {
    const transaction = await this.transaction(mode);
    const made = request(transaction.objectStore(STORE));
    return new Promise((resolve, reject) => {
      transaction.oncomplete = () => resolve(made.result);
      transaction.onabort = () =>
        reject(transaction.error ?? new Error("the IndexedDB transaction was aborted"));
    });
  }

  /**
   * A transaction on the current connection. The browser closes a connection when the user clears
   * the site's data or the database is deleted: the next call then opens a new one (and recreates
   * the store) instead of failing for as long as the page lives.
   */
  private async transaction(mode: IDBTransactionMode): Promise<IDBTransaction> {
    const options: IDBTransactionOptions = mode === "readwrite" ? { durability: "strict" } : {};
    try {
      return (await this.database()).transaction(STORE, mode, options);
    } catch (error) {
      if (!(error instanceof Error) || error.name !== "InvalidStateError") throw error;
      this.forget();
      return (await this.database()).transaction(STORE, mode, options);
    }
  }

  private database(): Promise<IDBDatabase> {
    this.connection ??= this.openDatabase().catch((error: unknown) => {
      this.forget();
      throw error;
    });
    return this.connection;
  }

  private forget(): void {
    this.connection = undefined;
    this.current = undefined;
  }

  /**
   * Opens the database, or fails once `openTimeoutMs` has passed. An open that succeeds after its
   * timeout closes the connection it got, so nothing holds the database open unseen; the next
   * call tries again.
   */
  private openDatabase(): Promise<IDBDatabase> {
    return new Promise((resolve, reject) => {
      let timedOut = false;
      const timer = Number.isFinite(this.openTimeoutMs)
        ? setTimeout(() => {
            timedOut = true;
            const error = new Error(
              `IndexedDB did not open the database "${this.name}" within ${this.openTimeoutMs} ms`,
            );
            error.name = "TimeoutError";
            reject(error);
          }, this.openTimeoutMs)
        : undefined;
      const request = this.factory.open(this.name, 1);
      request.onupgradeneeded = () => {
        if (!request.result.objectStoreNames.contains(STORE)) request.result.createObjectStore(STORE);
      };
      request.onsuccess = () => {
        clearTimeout(timer);
        const database = request.result;
        if (timedOut) {
          database.close();
          return;
        }
        // Another tab's newer page asking for a new version must not wait for this one to close.
        const forget = () => {
          if (this.current === database) this.forget();
        };
        database.onversionchange = () => {
          database.close();
          forget();
        };
        database.onclose = forget;
        this.current = database;
        resolve(database);
      };
      request.onerror = () => {
        clearTimeout(timer);
        reject(request.error ?? new Error("IndexedDB could not be opened"));
      };
    });
  }
}
