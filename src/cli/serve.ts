import type { Config } from "../config.ts";
import { jsonLogger, type Logger } from "../http/logger.ts";
import { startServer } from "../server.ts";
import { refuseUnusableAddress } from "../startup-checks.ts";
import { UsageError } from "./args.ts";
import { err, OutputError, out } from "./console.ts";
import { holdSignals, signalExitCode } from "./held-signals.ts";
import { describeInit, finishInit, initialiseIfNeeded, unprintedKeys } from "./init.ts";
import { INIT_STAGING_PREFIX } from "./interrupted-init.ts";
import { resolvePassphrase } from "./secrets.ts";
import { type Command, isInitialised, leftoverFolders, refuseInterruptedRestore } from "./shared.ts";

export const serveCommand: Command = {
  name: "serve",
  summary:
    "Run the HTTP service. A data dir without store and keystore is initialised first and the new API keys are printed.",
  usage:
    "licensing serve [--data-dir DIR] [--port N] [--host H] [--base-url URL] [--passphrase-file FILE] [--test-clock]",
  configKeys: [
    "dataDir",
    "port",
    "host",
    "baseUrl",
    "passphraseFile",
    "smtpUrl",
    "mailFrom",
    "webhookAllowPrivateNetworks",
    "testClock",
    "logLevel",
    "sealedFileEnvironments",
    "metricsToken",
    "runtimeRateLimitIp",
    "runtimeRateLimitActivation",
    "runtimeRateLimitLicense",
    "trustForwardedFor",
  ],
  options: [],
  async run(line) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const { config } = line;
    const logger = jsonLogger(config.logLevel);
    // Before anything else, initialised or not: the files in place may be only part of a restore.
    refuseInterruptedRestore(config.dataDir);
    if (!isInitialised(config.dataDir) || leftoverFolders(config.dataDir, INIT_STAGING_PREFIX).length > 0) {
      await refuseUnusableAddress(config);
    }
    const stoppedEarly = await initialiseFirst(config, logger);
    if (stoppedEarly !== null) return stoppedEarly;
    const { passphrase } = resolvePassphrase(config);
    const server = startServer({ config, passphrase, logger });

    const onSignal = (signal: NodeJS.Signals) => {
      void server.shutdown(signal);
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);

    try {
      out(`Licensing service listening on ${server.url} (base URL ${config.baseUrl})`);
      if (config.testClock) out("WARNING: the test clock is enabled; this instance is for testing only.");
    } catch (error) {
      // A server whose stdout is full or closed goes on serving: the same news is in the log.
      if (!(error instanceof OutputError)) throw error;
    }
    logger.log("info", "listening", { url: server.url, base_url: config.baseUrl, data_dir: config.dataDir });

    await server.closed;
    return 0;
  },
};

/**
 * Sets up a data dir that needs it and prints its API keys. Ctrl-C and SIGTERM meanwhile take
 * effect once the keys are printed (the only time they are): the exit status for the signal then,
 * null to go on serving.
 */
async function initialiseFirst(config: Config, logger: Logger): Promise<number | null> {
  const signals = holdSignals();
  try {
    const init = initialiseIfNeeded(config);
    if (init) {
      try {
        for (const note of init.recovered) err(note);
        out(describeInit(init));
      } catch (error) {
        // Serving on keys nobody saw would look like a working install no one can call.
        if (error instanceof OutputError) throw unprintedKeys(init, error);
        throw error;
      } finally {
        finishInit(init);
      }
      logger.log("info", "data dir initialised", { data_dir: init.dataDir, migrations: init.migrations });
    }
    await signals.settle();
    const signal = signals.received();
    if (signal === null) return null;
    err(
      `licensing serve: stopped by ${signal} before serving${init ? "; the API keys above are not shown again" : ""}`,
    );
    return signalExitCode(signal);
  } finally {
    signals.release();
  }
}
