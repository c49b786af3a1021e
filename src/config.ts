import { join, resolve } from "node:path";
import {
  type FlagValues,
  type OptionSpec,
  type ParsedArgs,
  parseArgs,
  parseBoolean,
  UsageError,
} from "./cli/args.ts";
import {
  hostForUrl,
  isUnspecifiedAddress,
  parseBaseUrl,
  parseEnvironments,
  parseLogLevel,
  parseMailFrom,
  parseMetricsToken,
  parsePort,
  parseRateLimit,
  parseSmtpUrl,
  validateHost,
} from "./config-values.ts";
import type { LogLevel } from "./http/logger.ts";
import {
  DEFAULT_RUNTIME_RATE_LIMITS,
  type RateLimitSetting,
  type RuntimeRateLimitSettings,
} from "./http/rate-limit.ts";

/**
 * Command-line flags, their environment twins and defaults, resolved into one validated Config.
 * Pure: everything it reads comes in as arguments, so every rule here is unit-tested.
 * Precedence: flag, then environment variable, then default.
 */

export interface Config {
  /** Absolute path of the data directory. */
  dataDir: string;
  port: number;
  host: string;
  /** Where clients reach the service; no trailing slash. */
  baseUrl: string;
  /** The base URL came from --base-url or LICENSING_BASE_URL, not from the host and port. */
  baseUrlGiven: boolean;
  /** From --passphrase-file or LICENSING_KEYSTORE_PASSPHRASE_FILE; absolute. */
  passphraseFile: string | null;
  /** From LICENSING_KEYSTORE_PASSPHRASE (deliberately no flag: argv is visible to every user). */
  passphrase: string | null;
  smtpUrl: string | null;
  mailFrom: string | null;
  webhookAllowPrivateNetworks: boolean;
  testClock: boolean;
  logLevel: LogLevel;
  /** Environments that offer sealed files; both by default. */
  sealedFileEnvironments: ("live" | "test")[];
  /** When set, GET /metrics answers to `Authorization: Bearer <token>`; when null it does not exist. */
  metricsToken: string | null;
  /** Runtime burst windows per client address, activation and license; null turns one off. */
  runtimeRateLimits: RuntimeRateLimitSettings;
  /** Behind a reverse proxy: the client address is the last X-Forwarded-For entry. */
  trustForwardedFor: boolean;
}

/** Every configuration option that has a flag. Commands pick the ones they accept by name. */
export const CONFIG_OPTIONS = {
  dataDir: {
    name: "data-dir",
    kind: "string",
    valueName: "DIR",
    env: "LICENSING_DATA_DIR",
    description: "data directory (store, keystore); default ./data",
  },
  port: {
    name: "port",
    kind: "string",
    valueName: "N",
    env: "LICENSING_PORT",
    description: "TCP port to listen on, 1-65535; default 8080",
  },
  host: {
    name: "host",
    kind: "string",
    valueName: "H",
    env: "LICENSING_HOST",
    description: "address to listen on; default 127.0.0.1",
  },
  baseUrl: {
    name: "base-url",
    kind: "string",
    valueName: "URL",
    env: "LICENSING_BASE_URL",
    description:
      "public URL clients use; default http://<host>:<port>, required when the host is 0.0.0.0 or :: (in any spelling)",
  },
  passphraseFile: {
    name: "passphrase-file",
    kind: "string",
    valueName: "FILE",
    env: "LICENSING_KEYSTORE_PASSPHRASE_FILE",
    description:
      "file holding the keystore passphrase; without it, the passphrase itself from " +
      "LICENSING_KEYSTORE_PASSPHRASE (no flag: every user sees argv), else <data-dir>/keystore.passphrase",
  },
  smtpUrl: {
    name: "smtp-url",
    kind: "string",
    valueName: "URL",
    env: "LICENSING_SMTP_URL",
    description: "SMTP server for outgoing mail (smtp:// or smtps://)",
  },
  mailFrom: {
    name: "mail-from",
    kind: "string",
    valueName: "ADDRESS",
    env: "LICENSING_MAIL_FROM",
    description: "sender address of outgoing mail",
  },
  webhookAllowPrivateNetworks: {
    name: "webhook-allow-private-networks",
    kind: "boolean",
    env: "LICENSING_WEBHOOK_ALLOW_PRIVATE_NETWORKS",
    description: "allow webhook targets on loopback and private networks",
  },
  testClock: {
    name: "test-clock",
    kind: "boolean",
    env: "LICENSING_TEST_CLOCK",
    description: "mount POST /testing/v1/clock so tests can move time forward (never in production)",
  },
  sealedFileEnvironments: {
    name: "sealed-files-environments",
    kind: "string",
    valueName: "LIST",
    env: "LICENSING_SEALED_FILES_ENVIRONMENTS",
    description: "environments that offer sealed files: live,test (default), live, test or none",
  },
  logLevel: {
    name: "log-level",
    kind: "string",
    valueName: "LEVEL",
    env: "LICENSING_LOG_LEVEL",
    description: "debug, info, warn or error; default info",
  },
  metricsToken: {
    name: "metrics-token",
    kind: "string",
    valueName: "TOKEN",
    env: "LICENSING_METRICS_TOKEN",
    description:
      "serve GET /metrics to requests bearing this token (16 to 256 visible ASCII characters); off when unset",
  },
  runtimeRateLimitIp: {
    name: "runtime-rate-limit-ip",
    kind: "string",
    valueName: "N/SEC",
    env: "LICENSING_RUNTIME_RATE_LIMIT_IP",
    description:
      "unauthenticated runtime calls per client address: N per SEC seconds, or off; default 600/60",
  },
  runtimeRateLimitActivation: {
    name: "runtime-rate-limit-activation",
    kind: "string",
    valueName: "N/SEC",
    env: "LICENSING_RUNTIME_RATE_LIMIT_ACTIVATION",
    description: "device-proof calls per activation: N per SEC seconds, or off; default 120/60",
  },
  runtimeRateLimitLicense: {
    name: "runtime-rate-limit-license",
    kind: "string",
    valueName: "N/SEC",
    env: "LICENSING_RUNTIME_RATE_LIMIT_LICENSE",
    description: "device-proof calls per license: N per SEC seconds, or off; default 6000/60",
  },
  trustForwardedFor: {
    name: "trust-forwarded-for",
    kind: "boolean",
    env: "LICENSING_TRUST_FORWARDED_FOR",
    description: "behind a reverse proxy: take the client address from the last X-Forwarded-For entry",
  },
} as const satisfies Record<string, OptionSpec & { env: string }>;

export type ConfigKey = keyof typeof CONFIG_OPTIONS;

export type Env = Record<string, string | undefined>;

export interface CommandLine extends ParsedArgs {
  config: Config;
}

/**
 * Parses `argv` against the config options a command accepts (`configKeys`) plus its own options,
 * and resolves the full Config: flags the command does not accept cannot be given, but their
 * environment twins still apply and are validated, so a bad environment is reported everywhere.
 */
export function parseCommandLine(
  argv: readonly string[],
  env: Env,
  cwd: string,
  configKeys: readonly ConfigKey[],
  ownOptions: readonly OptionSpec[] = [],
): CommandLine {
  const parsed = parseArgs(argv, [...configKeys.map((key) => CONFIG_OPTIONS[key]), ...ownOptions]);
  if (parsed.help) return { ...parsed, config: resolveConfig({}, {}, cwd) };
  // Only a command that puts the base URL somewhere (serve, offline issue, billing) needs a
  // usable one; `keys list` in a container whose environment says LICENSING_HOST=0.0.0.0 must
  // still run.
  return { ...parsed, config: resolveConfig(parsed.flags, env, cwd, configKeys.includes("baseUrl")) };
}

/**
 * Flags (keyed by flag name) over environment over defaults. With `usesBaseUrl`, a base URL that
 * would be derived from a wildcard listen address is a usage error (see defaultBaseUrl).
 */
export function resolveConfig(flags: FlagValues, env: Env, cwd: string, usesBaseUrl = true): Config {
  const text = (key: ConfigKey): { value: string; source: string } | null => {
    const option = CONFIG_OPTIONS[key];
    const flag = flags[option.name];
    if (typeof flag === "string") return { value: flag, source: `--${option.name}` };
    const fromEnv = env[option.env];
    if (fromEnv !== undefined && fromEnv !== "") return { value: fromEnv, source: option.env };
    return null;
  };
  const bool = (key: ConfigKey): boolean => {
    const option = CONFIG_OPTIONS[key];
    const flag = flags[option.name];
    if (typeof flag === "boolean") return flag;
    const fromEnv = env[option.env];
    if (fromEnv === undefined || fromEnv === "") return false;
    return parseBoolean(fromEnv, option.env);
  };

  const dataDir = text("dataDir");
  const port = text("port");
  const hostSetting = text("host");
  const host = hostSetting?.value ?? "127.0.0.1";
  const portNumber = port ? parsePort(port.value, port.source) : 8080;
  const baseUrl = text("baseUrl");
  const passphraseFile = text("passphraseFile");
  const smtpUrl = text("smtpUrl");
  const mailFrom = text("mailFrom");
  const logLevel = text("logLevel");
  const sealedFiles = text("sealedFileEnvironments");
  const metricsToken = text("metricsToken");
  const passphrase = env.LICENSING_KEYSTORE_PASSPHRASE;
  const rateLimit = (
    key: "runtimeRateLimitIp" | "runtimeRateLimitActivation" | "runtimeRateLimitLicense",
    fallback: RateLimitSetting | null,
  ) => {
    const value = text(key);
    return value ? parseRateLimit(value.value, value.source) : fallback;
  };

  return {
    dataDir: absolute(dataDir?.value ?? "data", cwd),
    port: portNumber,
    host: hostSetting ? validateHost(hostSetting.value, hostSetting.source) : host,
    baseUrl: baseUrl
      ? parseBaseUrl(baseUrl.value, baseUrl.source)
      : defaultBaseUrl(host, hostSetting?.source ?? "", portNumber, usesBaseUrl),
    baseUrlGiven: baseUrl !== null,
    passphraseFile: passphraseFile ? absolute(passphraseFile.value, cwd) : null,
    passphrase: passphrase === undefined || passphrase === "" ? null : passphrase,
    smtpUrl: smtpUrl ? parseSmtpUrl(smtpUrl.value, smtpUrl.source) : null,
    mailFrom: mailFrom ? parseMailFrom(mailFrom.value, mailFrom.source) : null,
    webhookAllowPrivateNetworks: bool("webhookAllowPrivateNetworks"),
    testClock: bool("testClock"),
    logLevel: logLevel ? parseLogLevel(logLevel.value, logLevel.source) : "info",
    sealedFileEnvironments: sealedFiles
      ? parseEnvironments(sealedFiles.value, sealedFiles.source)
      : ["live", "test"],
    metricsToken: metricsToken ? parseMetricsToken(metricsToken.value, metricsToken.source) : null,
    runtimeRateLimits: {
      ip: rateLimit("runtimeRateLimitIp", DEFAULT_RUNTIME_RATE_LIMITS.ip),
      activation: rateLimit("runtimeRateLimitActivation", DEFAULT_RUNTIME_RATE_LIMITS.activation),
      license: rateLimit("runtimeRateLimitLicense", DEFAULT_RUNTIME_RATE_LIMITS.license),
    },
    trustForwardedFor: bool("trustForwardedFor"),
  };
}

/** Fixed names inside the data directory. */
export const dataPaths = (dataDir: string) => ({
  store: join(dataDir, "licensing.db"),
  keystore: join(dataDir, "keystore.json"),
  passphrase: join(dataDir, "keystore.passphrase"),
  /** Held by the running server (store/serve-lock.ts); not part of a backup. */
  serveLock: join(dataDir, "serve.lock"),
});

/** Absolute and without a trailing separator, so `--data-dir data/` names the same place as `data`. */
const absolute = (path: string, cwd: string): string => resolve(cwd, path);

/**
 * http://<host>:<port>, unless the host is a wildcard (0.0.0.0, ::, or a spelling of them): that
 * is an address to listen on, not one to reach. The base URL goes into every integration config
 * (`api_url`, the trust-bundle URL) that vendors build into shipped apps and into certificates'
 * `iss`, so a wrong one outlives the server's start; refusing costs one flag, a warning in a log
 * would not stop it shipping.
 */
function defaultBaseUrl(host: string, hostSource: string, port: number, usesBaseUrl: boolean): string {
  const url = `http://${hostForUrl(host)}:${port}`;
  if (usesBaseUrl && isUnspecifiedAddress(new URL(url).hostname)) {
    throw new UsageError(
      `${hostSource} ${host} listens on every interface, so it cannot be the base URL clients use: ` +
        `set --base-url (or ${CONFIG_OPTIONS.baseUrl.env}) to the service's public URL, ` +
        "e.g. https://licensing.example.com",
    );
  }
  return url;
}
