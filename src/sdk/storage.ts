/**
 * Where the client keeps its state. Any async string key-value store works (a file, the OS
 * keychain, IndexedDB, ...). Device private keys are stored here: use storage that is private to
 * the app and the user.
 */

export interface Storage {
  get(key: string): Promise<string | undefined>;
  set(key: string, value: string): Promise<void>;
  delete(key: string): Promise<void>;
}

/** Keeps everything in memory; state is lost when the process ends. The default. */
export class MemoryStorage implements Storage {
  private readonly map = new Map<string, string>();

  async get(key: string): Promise<string | undefined> {
    return this.map.get(key);
  }

  async set(key: string, value: string): Promise<void> {
    this.map.set(key, value);
  }

  async delete(key: string): Promise<void> {
    this.map.delete(key);
  }

  /** The stored keys (for tests and debugging). */
  keys(): string[] {
    return [...this.map.keys()];
  }
}

/** The subset of the Web Storage API the adapter needs (window.localStorage satisfies it). */
export interface WebStorageLike {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/**
 * Adapts a Web Storage object. Nothing global is touched: pass `window.localStorage` (or any
 * other implementation) explicitly.
 */
export class LocalStorageAdapter implements Storage {
  constructor(private readonly store: WebStorageLike) {}

  async get(key: string): Promise<string | undefined> {
    return this.store.getItem(key) ?? undefined;
  }

  async set(key: string, value: string): Promise<void> {
    this.store.setItem(key, value);
  }

  async delete(key: string): Promise<void> {
    this.store.removeItem(key);
  }
}
