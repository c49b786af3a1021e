import type { LockManagerLike, Storage } from "../../../src/sdk/index.ts";

/** Web Locks as a browser grants them: one holder per name, the others wait their turn. */
export class FakeLocks implements LockManagerLike {
  readonly names: string[] = [];
  /** Called at each request, before it waits its turn. */
  onRequest: () => void = () => undefined;
  private readonly tails = new Map<string, Promise<unknown>>();

  request<T>(name: string, callback: () => Promise<T>): Promise<T> {
    this.names.push(name);
    this.onRequest();
    const run = (this.tails.get(name) ?? Promise.resolve()).then(() => callback());
    this.tails.set(
      name,
      run.catch(() => undefined),
    );
    return run;
  }
}

/**
 * One `localStorage` as Chromium shows it to tabs in different processes: a tab sees its own
 * writes at once, and another tab's only once they are delivered, whatever Web Lock either held
 * when writing or reading. Here they are delivered when the test says (`deliver()`), so a race
 * that real tabs lose about one run in ten is lost every time. Delivery replays every write since
 * the last one to every tab in the order made, so the tabs agree again afterwards (the last
 * writer wins).
 */
export class LaggingTabs {
  private readonly delivered = new Map<string, string>();
  private readonly views: Map<string, string>[] = [];
  private pending: { key: string; value: string | undefined }[] = [];

  /** The storage one tab sees (a new tab sees everything delivered so far). */
  tab(): Storage {
    const seen = new Map(this.delivered);
    this.views.push(seen);
    const write = (key: string, value: string | undefined) => {
      if (value === undefined) seen.delete(key);
      else seen.set(key, value);
      this.pending.push({ key, value });
    };
    return {
      get: async (key) => seen.get(key),
      set: async (key, value) => write(key, value),
      delete: async (key) => write(key, undefined),
    };
  }

  /** Shows every tab every write made so far. */
  deliver(): void {
    for (const { key, value } of this.pending)
      for (const view of [this.delivered, ...this.views]) {
        if (value === undefined) view.delete(key);
        else view.set(key, value);
      }
    this.pending = [];
  }
}
