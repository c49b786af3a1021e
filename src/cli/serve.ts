import { jsonLogger } from "../http/logger.ts";
import { startServer } from "../server.ts";
import { UsageError } from "./args.ts";
import { describeInit, initialise } from "./init.ts";
import { type Command, isInitialised, out, refuseInterruptedRestore, resolvePassphrase } from "./shared.ts";

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
    if (!isInitialised(config.dataDir)) {
      const result = initialise(config);
      out(describeInit(result));
      logger.log("info", "data dir initialised", { data_dir: result.dataDir, migrations: result.migrations });
    }
    const { passphrase } = resolvePassphrase(config, { generate: false });
    const server = startServer({ config, passphrase, logger });

    const onSignal = (signal: NodeJS.Signals) => {
      void server.shutdown(signal);
    };
    process.on("SIGTERM", onSignal);
    process.on("SIGINT", onSignal);

    out(`Licensing service listening on ${server.url} (base URL ${config.baseUrl})`);
    if (config.testClock) out("WARNING: the test clock is enabled; this instance is for testing only.");
    logger.log("info", "listening", { url: server.url, base_url: config.baseUrl, data_dir: config.dataDir });

    await server.closed;
    return 0;
  },
};
