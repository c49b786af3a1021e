import { constants } from "node:os";

// SIGHUP (the terminal or SSH session closed) and SIGQUIT end a process as surely as the other two.
const HELD = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"] as const;

export interface HeldSignals {
  /**
   * The first of the held signals that arrived since holding began, once the event loop has turned
   * after it: a handler runs only then, never in the middle of synchronous work.
   */
  received(): NodeJS.Signals | null;
  /** Lets one turn of the event loop pass, so a signal that arrived meanwhile is received. */
  settle(): Promise<void>;
  /** Stops holding: the signals' earlier handling (by default, ending the process) applies again. */
  release(): void;
}

/** The shell's exit status for a process ended by `signal`: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP. */
export const signalExitCode = (signal: NodeJS.Signals): number => 128 + constants.signals[signal];

/**
 * Holds SIGINT, SIGTERM, SIGHUP and SIGQUIT back: from now on they do not end the process at once, as they do by
 * default, but are recorded for the holder to act on when it is done. For work that must not be cut
 * short, such as a first start between creating API keys and printing them: ended there, it would
 * leave an install whose keys no one ever saw.
 */
export function holdSignals(): HeldSignals {
  let first: NodeJS.Signals | null = null;
  const listener = (signal: NodeJS.Signals) => {
    first ??= signal;
  };
  for (const signal of HELD) process.on(signal, listener);
  return {
    received: () => first,
    settle: () => new Promise((resolve) => setImmediate(resolve)),
    release() {
      for (const signal of HELD) process.off(signal, listener);
    },
  };
}
