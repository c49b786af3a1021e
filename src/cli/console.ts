/** How a command talks to its operator: lines on stdout and stderr, and failures worth one line. */
import { writeSync } from "node:fs";
import { systemDescription } from "../fs/atomic-file.ts";

/** A failure the operator can act on: printed as one line, no stack trace. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode = 1,
  ) {
    super(message);
    this.name = "CliError";
  }
}

/**
 * stdout could not take what a command printed (a full disk, /dev/full, a closed pipe). A command
 * that printed a secret shown only once catches it to say what it created and nobody saw.
 */
export class OutputError extends CliError {
  constructor(readonly reason: string) {
    super(`cannot print to stdout: ${reason}`);
    this.name = "OutputError";
  }
}

const pause = new Int32Array(new SharedArrayBuffer(4));
/** The longest pause between tries while a non-blocking stdout's reader is behind. */
const MAX_PAUSE_MS = 50;

/**
 * Every byte to fd 1, synchronously, or an OutputError. `process.stdout.write` reports a failed
 * write only to an 'error' listener, later or never, and the command would exit 0 having printed
 * nothing; a write may also take only part of the bytes. A non-blocking pipe whose reader is
 * behind answers EAGAIN: waited out, as a blocking write would wait.
 */
function writeStdout(text: string): void {
  const bytes = Buffer.from(text);
  let offset = 0;
  let pauseMs = 1;
  while (offset < bytes.length) {
    try {
      offset += writeSync(1, bytes, offset);
      pauseMs = 1;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EAGAIN") throw new OutputError(systemDescription(error));
      Atomics.wait(pause, 0, 0, pauseMs);
      pauseMs = Math.min(pauseMs * 2, MAX_PAUSE_MS);
    }
  }
}

let stdoutWriter: (text: string) => void = writeStdout;

/**
 * Sends what `out` prints to `write` until the returned function is called: for tests that run a
 * command in this process and read its output.
 */
export function captureStdout(write: (text: string) => void): () => void {
  const previous = stdoutWriter;
  stdoutWriter = write;
  return () => {
    stdoutWriter = previous;
  };
}

/** Prints `text` as lines on stdout; throws OutputError when stdout does not take all of it. */
export const out = (text: string): void => {
  stdoutWriter(text.endsWith("\n") ? text : `${text}\n`);
};
export const err = (text: string): void => {
  process.stderr.write(text.endsWith("\n") ? text : `${text}\n`);
};
