import type { Server } from "bun";
import { type Config, dataPaths } from "./config.ts";

/** A start-up failure the operator can act on; printed as one line without a stack trace. */
export class StartupError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "StartupError";
  }
}

/** The files of a data directory that the server writes in place (the keystore is replaced whole). */
export const filesWrittenInPlace = (dataDir: string): string[] => {
  const paths = dataPaths(dataDir);
  return [paths.store, `${paths.store}-wal`, `${paths.store}-shm`, paths.serveLock];
};

/**
 * "cannot listen", with what to change: Bun's own words ("Is port 8080 in use?") name neither the
 * flag nor the variable.
 */
export function cannotListen(config: Pick<Config, "host" | "port">, error: unknown): StartupError {
  return new StartupError(
    `cannot listen on ${config.host}:${config.port} (${(error as Error).message}): stop what uses it, ` +
      "or choose another port with --port (LICENSING_PORT) or another address with --host (LICENSING_HOST)",
  );
}

/**
 * Binds the address and lets it go again: a first start checks it before it creates API keys that
 * it shows only once, rather than printing them and then failing on a port in use.
 */
export async function refuseUnusableAddress(config: Pick<Config, "host" | "port">): Promise<void> {
  let probe: Server<undefined>;
  try {
    probe = Bun.serve({
      hostname: config.host,
      port: config.port,
      reusePort: false,
      development: false,
      fetch: () => new Response(null, { status: 503 }),
    });
  } catch (error) {
    throw cannotListen(config, error);
  }
  await probe.stop(true);
}
