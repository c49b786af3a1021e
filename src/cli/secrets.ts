import { closeSync, existsSync, openSync, readSync, statSync } from "node:fs";
import { type CommandLine, dataPaths } from "../config.ts";
import { CliError, err } from "./console.ts";

/** Where the commands get their secrets: the keystore passphrase and one-line secret files. */

export interface PassphraseSource {
  passphrase: string;
  /** The file it came from; null when it came from LICENSING_KEYSTORE_PASSPHRASE. */
  file: string | null;
  generated: boolean;
}

const MIN_NEW_PASSPHRASE = 12;

/**
 * --passphrase-file, LICENSING_KEYSTORE_PASSPHRASE_FILE, LICENSING_KEYSTORE_PASSPHRASE, then
 * <data>/keystore.passphrase. Only a first start generates one, and only where none is given
 * (init.ts).
 */
export function resolvePassphrase(config: CommandLine["config"]): PassphraseSource {
  if (config.passphraseFile) {
    return {
      passphrase: readPassphraseFile(config.passphraseFile),
      file: config.passphraseFile,
      generated: false,
    };
  }
  if (config.passphrase !== null) return { passphrase: config.passphrase, file: null, generated: false };
  const file = dataPaths(config.dataDir).passphrase;
  if (existsSync(file)) return { passphrase: readPassphraseFile(file), file, generated: false };
  throw new CliError(
    `no keystore passphrase: ${file} does not exist; give --passphrase-file, ` +
      "LICENSING_KEYSTORE_PASSPHRASE_FILE or LICENSING_KEYSTORE_PASSPHRASE",
  );
}

/**
 * A passphrase for a new keystore. One from LICENSING_KEYSTORE_PASSPHRASE that ends in a line
 * break (a secret mounted from a file with its newline, `$(cat file)` keeps none) is refused: a
 * passphrase file drops trailing CR/LF (readSecretLine), so the keystore would open only from the
 * variable, never from a file holding the same text, nor from a backup's `--include-passphrase`.
 * Only new keystores are checked: an existing one keeps opening with the passphrase it was sealed
 * with, byte for byte.
 */
export function checkNewPassphrase(source: PassphraseSource): void {
  if (source.file === null && /[\r\n]$/.test(source.passphrase)) {
    throw new CliError(
      "LICENSING_KEYSTORE_PASSPHRASE ends in a line break (CR or LF), which a passphrase file cannot hold; " +
        "set it without the trailing line break, or give the passphrase in LICENSING_KEYSTORE_PASSPHRASE_FILE",
    );
  }
  if (!source.generated && source.passphrase.length < MIN_NEW_PASSPHRASE) {
    throw new CliError(`the keystore passphrase must be at least ${MIN_NEW_PASSPHRASE} characters long`);
  }
}

/**
 * Far more than any passphrase or token; a file past it is the wrong file. Without a bound, a
 * mistyped path (/dev/zero, a log) is read until memory runs out.
 */
export const MAX_SECRET_FILE_BYTES = 64 * 1024;

/**
 * The bytes of a file, or of an open descriptor (0 for stdin), read up to `maxBytes`; null when
 * it holds more. Reads in a loop, as devices, pipes and FIFOs give their bytes in pieces and
 * report no size to check beforehand.
 */
export function readBoundedFile(file: string | number, maxBytes: number): Buffer | null {
  const fd = typeof file === "number" ? file : openSync(file, "r");
  try {
    // One byte past the bound tells "exactly at it" from "more".
    const buffer = Buffer.alloc(maxBytes + 1);
    let length = 0;
    while (length < buffer.length) {
      const read = readSync(fd, buffer, length, buffer.length - length, null);
      if (read === 0) break;
      length += read;
    }
    return length > maxBytes ? null : buffer.subarray(0, length);
  } finally {
    if (typeof file !== "number") closeSync(fd);
  }
}

/**
 * A secret kept as one line: a file's contents, or stdin's for descriptor 0, read no further than
 * {@link MAX_SECRET_FILE_BYTES}. Trailing line breaks (from `echo secret > file`) are not part of
 * it; an empty one is refused. `named` says what it is in messages ("the passphrase file /x").
 * A file other users can read earns a warning, not a refusal: it may be on its way to a vault.
 */
export function readSecretLine(file: string | 0, named: string): string {
  let bytes: Buffer | null;
  try {
    bytes = readBoundedFile(file, MAX_SECRET_FILE_BYTES);
  } catch (error) {
    throw new CliError(`cannot read ${named}: ${(error as Error).message}`);
  }
  if (bytes === null) throw new CliError(`${named} is larger than ${MAX_SECRET_FILE_BYTES / 1024} KiB`);
  const secret = bytes.toString("utf8").replace(/[\r\n]+$/, "");
  if (secret === "") throw new CliError(`${named} is empty`);
  if (typeof file === "string" && (statSync(file).mode & 0o077) !== 0) {
    err(`warning: ${file} is readable by other users; chmod 600 it`);
  }
  return secret;
}

const readPassphraseFile = (path: string): string => readSecretLine(path, `the passphrase file ${path}`);
