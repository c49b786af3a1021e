import { describe, expect, test } from "bun:test";
import { parseArgs, UsageError } from "../../src/cli/args.ts";
import { CONFIG_OPTIONS, type ConfigKey, parseCommandLine, resolveConfig } from "../../src/config.ts";

const CWD = "/srv/licensing";
const ALL = Object.keys(CONFIG_OPTIONS) as ConfigKey[];
const serve = (argv: string[], env: Record<string, string> = {}) =>
  parseCommandLine(argv, env, CWD, ALL).config;

describe("configuration defaults", () => {
  test("with no flags and no environment the documented defaults apply", () => {
    expect(serve([])).toEqual({
      dataDir: "/srv/licensing/data",
      port: 8080,
      host: "127.0.0.1",
      baseUrl: "http://127.0.0.1:8080",
      baseUrlGiven: false,
      passphraseFile: null,
      passphrase: null,
      smtpUrl: null,
      mailFrom: null,
      webhookAllowPrivateNetworks: false,
      testClock: false,
      logLevel: "info",
      metricsToken: null,
      sealedFileEnvironments: ["live", "test"],
      runtimeRateLimits: {
        ip: { limit: 600, windowSec: 60 },
        activation: { limit: 120, windowSec: 60 },
        license: { limit: 6_000, windowSec: 60 },
      },
      trustForwardedFor: false,
    });
  });

  test("the default base URL follows the host and port", () => {
    expect(serve(["--host", "10.0.0.5", "--port", "9000"]).baseUrl).toBe("http://10.0.0.5:9000");
  });

  test("a wildcard host without a base URL is a usage error telling the operator to set one", () => {
    for (const host of ["0.0.0.0", "::", "0:0:0:0:0:0:0:0"]) {
      expect(() => serve(["--host", host])).toThrow(
        new UsageError(
          `--host ${host} listens on every interface, so it cannot be the base URL clients use: ` +
            "set --base-url (or LICENSING_BASE_URL) to the service's public URL, e.g. https://licensing.example.com",
        ),
      );
    }
    expect(() => serve([], { LICENSING_HOST: "0.0.0.0" })).toThrow(/^LICENSING_HOST 0\.0\.0\.0 listens/);
  });

  test("every spelling of the unspecified address counts as a wildcard host, IPv4-mapped included", () => {
    for (const host of [
      "::ffff:0.0.0.0",
      "::ffff:0:0",
      "0:0:0:0:0:ffff:0.0.0.0",
      "::FFFF:0000:0000",
      "::0.0.0.0",
      "0000::0000",
      "0::0",
      "0",
      "0x0",
      "000.000.000.000",
      "0.0",
      "0.0.0.0.",
    ]) {
      expect(() => serve(["--host", host])).toThrow(`--host ${host} listens on every interface`);
      expect(() => serve([], { LICENSING_HOST: host })).toThrow(`LICENSING_HOST ${host} listens`);
      expect(serve(["--host", host, "--base-url", "https://l.example.com"]).host).toBe(host);
    }
  });

  test("addresses next to the unspecified one and hostnames are not wildcards", () => {
    for (const host of ["::ffff:0.0.0.1", "::ffff:127.0.0.1", "::1", "1::", "::1:0:0"]) {
      expect(serve(["--host", host]).baseUrl).toBe(`http://[${host}]:8080`);
    }
    for (const host of ["0.0.0.1", "0.0.0.0.example", "localhost"]) {
      expect(serve(["--host", host]).baseUrl).toBe(`http://${host}:8080`);
    }
  });

  test("a wildcard host with a base URL listens on every interface and keeps the base URL given", () => {
    const config = serve(["--host", "0.0.0.0", "--base-url", "https://licensing.example.com"]);
    expect(config.host).toBe("0.0.0.0");
    expect(config.baseUrl).toBe("https://licensing.example.com");
    expect(serve(["--host", "::"], { LICENSING_BASE_URL: "https://l.example.com" }).host).toBe("::");
  });

  test("a command that puts no base URL anywhere runs with a wildcard host in the environment", () => {
    const line = parseCommandLine([], { LICENSING_HOST: "0.0.0.0" }, CWD, ["dataDir", "passphraseFile"]);
    expect(line.config.host).toBe("0.0.0.0");
  });

  test("an IPv6 host is bracketed in the default base URL", () => {
    expect(serve(["--host", "::1"]).baseUrl).toBe("http://[::1]:8080");
  });

  test("relative paths resolve against the working directory", () => {
    const config = serve(["--data-dir", "var/lib", "--passphrase-file", "../secret"]);
    expect(config.dataDir).toBe("/srv/licensing/var/lib");
    expect(config.passphraseFile).toBe("/srv/secret");
  });
});

describe("environment twins", () => {
  const env = {
    LICENSING_DATA_DIR: "/data",
    LICENSING_PORT: "9090",
    LICENSING_HOST: "10.0.0.5",
    LICENSING_BASE_URL: "https://licensing.example.com/",
    LICENSING_KEYSTORE_PASSPHRASE_FILE: "/run/secrets/passphrase",
    LICENSING_KEYSTORE_PASSPHRASE: "correct horse battery staple",
    LICENSING_SMTP_URL: "smtps://user:pw@mail.example.com:465",
    LICENSING_MAIL_FROM: "Licensing <licensing@example.com>",
    LICENSING_WEBHOOK_ALLOW_PRIVATE_NETWORKS: "true",
    LICENSING_TEST_CLOCK: "1",
    LICENSING_LOG_LEVEL: "WARN",
    LICENSING_METRICS_TOKEN: "scrape-token-0123456789",
    LICENSING_SEALED_FILES_ENVIRONMENTS: "live",
    LICENSING_RUNTIME_RATE_LIMIT_IP: "off",
    LICENSING_RUNTIME_RATE_LIMIT_ACTIVATION: "10/1",
    LICENSING_RUNTIME_RATE_LIMIT_LICENSE: "1000/3600",
    LICENSING_TRUST_FORWARDED_FOR: "yes",
  };

  test("every option is read from its environment variable", () => {
    expect(serve([], env)).toEqual({
      dataDir: "/data",
      port: 9090,
      host: "10.0.0.5",
      baseUrl: "https://licensing.example.com",
      baseUrlGiven: true,
      passphraseFile: "/run/secrets/passphrase",
      passphrase: "correct horse battery staple",
      smtpUrl: "smtps://user:pw@mail.example.com:465",
      mailFrom: "Licensing <licensing@example.com>",
      webhookAllowPrivateNetworks: true,
      testClock: true,
      logLevel: "warn",
      metricsToken: "scrape-token-0123456789",
      sealedFileEnvironments: ["live"],
      runtimeRateLimits: {
        ip: null,
        activation: { limit: 10, windowSec: 1 },
        license: { limit: 1000, windowSec: 3600 },
      },
      trustForwardedFor: true,
    });
  });

  test("a flag wins over its environment twin", () => {
    const config = serve(["--port=7000", "--data-dir", "/other", "--test-clock=false"], env);
    expect(config.port).toBe(7000);
    expect(config.dataDir).toBe("/other");
    expect(config.testClock).toBe(false);
  });

  test("an empty environment variable counts as unset", () => {
    expect(serve([], { LICENSING_PORT: "", LICENSING_TEST_CLOCK: "" })).toMatchObject({
      port: 8080,
      testClock: false,
    });
  });

  test("a bad environment value is reported with the variable's name", () => {
    expect(() => serve([], { LICENSING_PORT: "http" })).toThrow(/LICENSING_PORT must be a port number/);
    expect(() => serve([], { LICENSING_TEST_CLOCK: "maybe" })).toThrow(/LICENSING_TEST_CLOCK must be true/);
  });
});

describe("validation", () => {
  test.each(["0", "65536", "-1", "80.5", "eighty", "1e3", "123456"])("port %p is refused", (port) => {
    expect(() => serve(["--port", port])).toThrow(UsageError);
  });

  test.each(["1", "65535", "08080"])("port %p is accepted", (port) => {
    expect(serve(["--port", port]).port).toBe(Number(port));
  });

  test("a base URL must be absolute http(s) without query or credentials", () => {
    expect(() => serve(["--base-url", "licensing.example.com"])).toThrow(/absolute http/);
    expect(() => serve(["--base-url", "ftp://example.com"])).toThrow(/http or https/);
    expect(() => serve(["--base-url", "https://example.com/?a=1"])).toThrow(/query/);
    expect(() => serve(["--base-url", "https://u:p@example.com"])).toThrow(/credentials/);
  });

  test("a base URL keeps its path but loses trailing slashes", () => {
    expect(serve(["--base-url", "https://example.com/licensing//"]).baseUrl).toBe(
      "https://example.com/licensing",
    );
  });

  test("the SMTP URL, sender address and log level are checked", () => {
    expect(() => serve(["--smtp-url", "http://mail"])).toThrow(/smtp/);
    expect(() => serve(["--mail-from", "nobody"])).toThrow(/email address/);
    expect(() => serve(["--log-level", "loud"])).toThrow(/debug, info, warn, error/);
  });

  test("a sender address is one whole address or name and address, one line without control characters", () => {
    for (const good of [
      "licensing@example.com",
      "Licensing <licensing@example.com>",
      '"Licensing, Inc." <licensing@example.com>',
      "<licensing@example.com>",
      "  Licensing <licensing@example.com>\n",
    ]) {
      expect(serve(["--mail-from", good]).mailFrom).toBe(good.trim());
    }
    for (const bad of [
      "x\r\nBcc: v@e.com <a@b.com>",
      "x\nBcc: v@e.com <a@b.com>",
      "Licensing\r <a@b.com>",
      "Li\u001bcensing <a@b.com>",
      "Licensing\u0085 <a@b.com>",
      "Licensing\t<a@b.com>",
      "a@b.com <c@d.com",
      "x <y> <a@b.com>",
      "a@b.com\r\nBcc: v@e.com",
    ]) {
      expect(() => serve(["--mail-from", bad])).toThrow(
        new UsageError(
          "--mail-from must be one line with an email address, e.g. licensing@example.com or Licensing <licensing@example.com>",
        ),
      );
      expect(() => serve([], { LICENSING_MAIL_FROM: bad })).toThrow(/^LICENSING_MAIL_FROM must be one line/);
    }
  });

  test("a metrics token must be 16 to 256 visible characters", () => {
    expect(() => serve(["--metrics-token", "short"])).toThrow(/--metrics-token must be 16 to 256/);
    expect(() => serve([], { LICENSING_METRICS_TOKEN: "has a space in it!" })).toThrow(
      /LICENSING_METRICS_TOKEN/,
    );
    expect(serve(["--metrics-token", "t".repeat(16)]).metricsToken).toBe("t".repeat(16));
  });

  test("runtime rate limits are N/SEC or off, within bounds", () => {
    expect(serve(["--runtime-rate-limit-ip", "5/2"]).runtimeRateLimits.ip).toEqual({
      limit: 5,
      windowSec: 2,
    });
    expect(serve(["--runtime-rate-limit-license", "OFF"]).runtimeRateLimits.license).toBeNull();
    for (const bad of ["0/60", "5/0", "5", "5/60s", "-1/60", "5/86401", "1e3/60", "unlimited"]) {
      expect(() => serve([], { LICENSING_RUNTIME_RATE_LIMIT_ACTIVATION: bad })).toThrow(
        /LICENSING_RUNTIME_RATE_LIMIT_ACTIVATION must be N\/SEC/,
      );
      expect(() => serve([`--runtime-rate-limit-ip=${bad}`])).toThrow(/--runtime-rate-limit-ip must be/);
    }
  });

  test("the environments offering sealed files are a list of live and test, or none", () => {
    expect(serve(["--sealed-files-environments", "test,live"]).sealedFileEnvironments).toEqual([
      "test",
      "live",
    ]);
    expect(serve(["--sealed-files-environments", "none"]).sealedFileEnvironments).toEqual([]);
    expect(() => serve(["--sealed-files-environments", "prod"])).toThrow(
      /--sealed-files-environments must be/,
    );
    expect(() => serve([], { LICENSING_SEALED_FILES_ENVIRONMENTS: "live,live" })).toThrow(
      /LICENSING_SEALED_FILES_ENVIRONMENTS/,
    );
  });

  test("a host with brackets or a path is refused", () => {
    expect(() => serve(["--host", "[::1]"])).toThrow(UsageError);
    expect(() => serve(["--host", "example.com/x"])).toThrow(UsageError);
  });

  test("a host no URL can hold is a usage error naming the flag or variable", () => {
    expect(() => serve(["--host", "999.1.1.1"])).toThrow(
      new UsageError('--host must be a hostname or IP address, not "999.1.1.1"'),
    );
    expect(() => serve([], { LICENSING_HOST: "1::2::3" })).toThrow(
      /^LICENSING_HOST must be a hostname or IP address/,
    );
    expect(serve(["--host", "::2"]).baseUrl).toBe("http://[::2]:8080");
  });

  test("a base URL that does not parse is echoed in the error without its user and password", () => {
    const message = (value: string, env = "LICENSING_BASE_URL") => {
      try {
        serve([], { [env]: value });
      } catch (error) {
        return (error as Error).message;
      }
      throw new Error(`${value} was accepted`);
    };
    expect(message("https://admin:hunter2@x:99999")).toBe(
      'LICENSING_BASE_URL must be an absolute http(s) URL, not "https://***@x:99999"',
    );
    // Where the credentials end is a guess in a URL that does not parse: an unencoded @ or / in
    // the password, or no scheme at all, still hides them.
    for (const value of [
      "https://admin:hun@ter2@x:99999",
      "https://admin:hun/ter2@x",
      "admin:hunter2@x:99999",
      "https:admin:hunter2@x:99999",
    ]) {
      expect(message(value)).not.toContain("hunter2");
      expect(message(value)).not.toContain("admin");
    }
    expect(message("https://example.com:99999")).toContain('"https://example.com:99999"');
    // An SMTP URL without its scheme reads the user name as one: it is not echoed either.
    for (const value of ["admin:hunter2@mail.example.com:587", "admin:hunter2@mail.example.com"]) {
      expect(message(value, "LICENSING_SMTP_URL")).toBe(
        "LICENSING_SMTP_URL must be an smtp:// or smtps:// URL",
      );
    }
    expect(message("https://mail.example.com", "LICENSING_SMTP_URL")).toContain("not https:");
  });

  test("a host holding a user and password is refused without echoing them", () => {
    for (const host of ["admin:hunter2@example.com", "admin@example.com", "example.com?x", "example.com#x"]) {
      let message = "";
      try {
        serve([], { LICENSING_HOST: host });
      } catch (error) {
        message = (error as Error).message;
      }
      expect(message).toStartWith("LICENSING_HOST must be a hostname or IP address");
      expect(message).not.toContain("hunter2");
      expect(message).not.toContain("admin");
    }
  });

  test("an SMTP user or password with a bad percent-escape is a usage error that does not echo it", () => {
    const bad = "smtp://user:p%ZZsecret@mail.example.com";
    expect(() => serve(["--smtp-url", bad])).toThrow(
      /^--smtp-url has a user or password that is not valid percent-encoding/,
    );
    expect(() => serve([], { LICENSING_SMTP_URL: bad })).toThrow(UsageError);
    let message = "";
    try {
      serve([], { LICENSING_SMTP_URL: bad });
    } catch (error) {
      message = (error as Error).message;
    }
    expect(message).toStartWith("LICENSING_SMTP_URL ");
    expect(message).not.toContain("secret");
    expect(serve(["--smtp-url", "smtp://us%40er:p%25w@mail.example.com"]).smtpUrl).toContain("p%25w");
  });
});

describe("the flag parser", () => {
  const options = [
    { name: "json", kind: "boolean", description: "" },
    { name: "name", kind: "string", description: "" },
  ] as const;

  test("it separates flags, positionals and help", () => {
    expect(parseArgs(["revoke", "--json", "--name", "x", "key_1", "-h"], options)).toEqual({
      flags: { json: true, name: "x" },
      positionals: ["revoke", "key_1"],
      help: true,
    });
  });

  test("everything after -- is positional", () => {
    expect(parseArgs(["--", "--json"], options).positionals).toEqual(["--json"]);
  });

  test("an unknown flag is an error", () => {
    expect(() => parseArgs(["--nope"], options)).toThrow("unknown option --nope");
    expect(() => parseArgs(["-x"], options)).toThrow("unknown option -x");
  });

  test("a flag that is only accepted by another command is unknown here", () => {
    expect(() => parseCommandLine(["--port", "80"], {}, CWD, ["dataDir"])).toThrow("unknown option --port");
  });

  test("a missing flag value is an error", () => {
    expect(() => parseArgs(["--name"], options)).toThrow("--name needs a value");
    expect(() => parseArgs(["--name", "--json"], options)).toThrow("--name needs a value");
    expect(() => parseArgs(["--name="], options)).toThrow("non-empty");
  });

  test("a repeated flag is an error", () => {
    expect(() => parseArgs(["--json", "--json"], options)).toThrow("more than once");
  });

  test("a boolean flag takes an explicit true or false only", () => {
    expect(parseArgs(["--json=false"], options).flags.json).toBe(false);
    expect(() => parseArgs(["--json=perhaps"], options)).toThrow(UsageError);
  });

  test("--help skips configuration validation so help works with a broken environment", () => {
    const line = parseCommandLine(["--help"], { LICENSING_PORT: "bad" }, CWD, ALL);
    expect(line.help).toBe(true);
  });
});

test("resolveConfig is a pure function of its inputs", () => {
  const env = { LICENSING_PORT: "1234" };
  expect(resolveConfig({}, env, "/a")).toEqual(resolveConfig({}, env, "/a"));
  expect(resolveConfig({}, env, "/a").dataDir).toBe("/a/data");
});
