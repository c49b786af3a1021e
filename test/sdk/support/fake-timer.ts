import type { Timer } from "../../../src/sdk/index.ts";

interface Task {
  id: number;
  at: number;
  delay: number;
  callback: () => unknown;
}

/** A manual timer: nothing runs until the test says so, and the test sees every delay asked for. */
export class FakeTimer implements Timer {
  now = 0;
  private tasks: Task[] = [];
  private nextId = 1;
  /** Every delay passed to setTimeout, in order. */
  readonly requested: number[] = [];

  setTimeout(callback: () => unknown, ms: number): unknown {
    const task = { id: this.nextId++, at: this.now + ms, delay: ms, callback };
    this.tasks.push(task);
    this.requested.push(ms);
    return task.id;
  }

  clearTimeout(handle: unknown): void {
    this.tasks = this.tasks.filter((t) => t.id !== handle);
  }

  /** Delays of the tasks still waiting. */
  pending(): number[] {
    return this.tasks.map((t) => t.delay);
  }

  /** Runs the earliest task (advancing the clock to it) and waits for the promise it returns. */
  async runNext(): Promise<void> {
    const task = [...this.tasks].sort((a, b) => a.at - b.at)[0];
    if (!task) throw new Error("no task scheduled");
    this.tasks = this.tasks.filter((t) => t !== task);
    this.now = task.at;
    await task.callback();
  }
}
