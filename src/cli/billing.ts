import { resolve } from "node:path";
import type { CommandLine } from "../config.ts";
import { ENVIRONMENTS, type Environment } from "../domain/scopes.ts";
import { ApiError } from "../http/errors.ts";
import type { BillingIntegrationView } from "../modules/billing/model.ts";
import {
  BillingService,
  baseUrlProblem,
  offeringNameProblem,
  PRICE_ID,
  presentOffering,
  WEBHOOK_PATH,
} from "../modules/billing/service.ts";
import { WorkspaceService } from "../modules/workspace/service.ts";
import { type OptionSpec, UsageError } from "./args.ts";
import { CliError, err, out } from "./console.ts";
import { table } from "./keys.ts";
import { readSecretLine } from "./secrets.ts";
import {
  type Command,
  type CommandContext,
  cliActor,
  JSON_OPTION,
  serviceBaseUrl,
  withKeystoreDeps,
} from "./shared.ts";

const CONFIG_KEYS = ["dataDir", "passphraseFile", "baseUrl"] as const;

/** The integration's secrets are sealed with the keystore's data key, so every command opens it. */
function withBilling<T>(line: CommandLine, work: (billing: BillingService, baseUrl: string) => T): T {
  return withKeystoreDeps(line, (deps) => {
    try {
      const workspace = new WorkspaceService(deps);
      const baseUrl = serviceBaseUrl(line.config, deps);
      return work(new BillingService(deps, () => workspace.plan(), baseUrl), baseUrl);
    } catch (error) {
      // The service speaks the API's language; an operator gets one line per problem.
      if (error instanceof ApiError) {
        const fields = (error.details.errors ?? {}) as Record<string, string[]>;
        const problems = Object.entries(fields).map(([field, messages]) => `${field} ${messages.join("; ")}`);
        throw new CliError(problems.length > 0 ? problems.join("; ") : error.message);
      }
      throw error;
    }
  });
}

/**
 * A secret from a file, or from stdin for `-`: never from argv, which every user on the host can
 * read in the process list. Stripe's keys and secrets are single words.
 */
function readSecret(path: string, what: string, context: CommandContext): string {
  const secret = readSecretLine(path === "-" ? 0 : resolve(context.cwd, path), `the ${what} in ${path}`);
  if (/\s/.test(secret)) throw new CliError(`the ${what} in ${path} has whitespace in it`);
  return secret;
}

const stringFlag = (line: CommandLine, name: string): string | undefined => {
  const value = line.flags[name];
  return typeof value === "string" ? value : undefined;
};

const requiredFlag = (line: CommandLine, name: string): string => {
  const value = stringFlag(line, name);
  if (value === undefined) throw new UsageError(`--${name} is required`);
  return value;
};

/** A URL flag, checked by the service's own rule before any secret is read or the keystore opened. */
const urlFlag = (line: CommandLine, name: string): string | undefined => {
  const value = stringFlag(line, name);
  const problem = value === undefined ? null : baseUrlProblem(value);
  if (problem !== null) throw new UsageError(`--${name} ${problem}`);
  return value;
};

const option = (name: string, valueName: string, description: string): OptionSpec => ({
  name,
  kind: "string",
  valueName,
  description,
});

export const billingConfigureCommand: Command = {
  name: "billing configure",
  summary:
    "Connect a Stripe account. The API key's mode (rk_live_/rk_test_) picks the environment; running it again replaces that mode's settings.",
  usage:
    "licensing billing configure --provider stripe --api-key-file F --webhook-secret-file F [--claim-url-base URL] [--secure-claims=false] [--api-base-url URL] [--base-url URL]",
  configKeys: CONFIG_KEYS,
  options: [
    option("provider", "NAME", "the billing provider: stripe"),
    option("api-key-file", "FILE", "file holding the restricted API key (- for stdin)"),
    option(
      "webhook-secret-file",
      "FILE",
      "file holding the webhook endpoint's signing secret, whsec_… (- for stdin)",
    ),
    option("claim-url-base", "URL", "public address buyers open claim links on (default: --base-url)"),
    {
      name: "secure-claims",
      kind: "boolean",
      description: "email a single-use claim link instead of the key itself (default true)",
    },
    option("api-base-url", "URL", "a Stripe-compatible API instead of https://api.stripe.com"),
    JSON_OPTION,
  ],
  run(line, context) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const provider = requiredFlag(line, "provider");
    if (provider !== "stripe")
      throw new UsageError(`unknown provider "${provider}"; only stripe is supported`);
    const keyFile = requiredFlag(line, "api-key-file");
    const secretFile = requiredFlag(line, "webhook-secret-file");
    if (keyFile === "-" && secretFile === "-")
      throw new UsageError("only one of the two secrets can come from stdin");
    const claimUrlBase = urlFlag(line, "claim-url-base");
    const apiBaseUrl = urlFlag(line, "api-base-url");
    const apiKey = readSecret(keyFile, "API key", context);
    const webhookSecret = readSecret(secretFile, "webhook signing secret", context);
    if (apiKey.startsWith("sk_"))
      err(
        "warning: this is a full secret key; a restricted key (rk_…) that can only read Checkout Sessions is enough",
      );
    const { row, baseUrl } = withBilling(line, (billing, baseUrl) => ({
      baseUrl,
      row: billing.configure(
        {
          provider: "stripe",
          apiKey,
          webhookSecret,
          claimUrlBase,
          apiBaseUrl,
          secureClaims: line.flags["secure-claims"] !== false,
        },
        cliActor(),
      ),
    }));
    const webhookUrl = `${baseUrl}${WEBHOOK_PATH}`;
    if (line.flags.json === true) {
      out(
        JSON.stringify({
          provider: row.provider,
          mode: row.environment,
          webhook_url: webhookUrl,
          secure_claims: row.secureClaims,
        }),
      );
    } else {
      out(
        `Billing integration configured: stripe, ${row.environment} mode.\n` +
          `Point the Stripe webhook endpoint (${row.environment} mode) at ${webhookUrl} with the events ` +
          "checkout.session.completed, checkout.session.async_payment_succeeded, invoice.paid, " +
          "customer.subscription.updated and customer.subscription.deleted.",
      );
    }
    return 0;
  },
};

export const billingOfferingCommand: Command = {
  name: "billing offering",
  summary: "Map provider prices to licenses: each price sells one product under one policy.",
  usage:
    "licensing billing offering add --price price_… --product prod_… --policy pol_… [--name N] [--duration-days N] [--json]\n" +
    "  licensing billing offering list [--json]\n" +
    "  licensing billing offering remove ID|PRICE [--json]",
  configKeys: CONFIG_KEYS,
  options: [
    option("price", "PRICE", "the provider's price id"),
    option("product", "ID", "the product a purchase licenses"),
    option("policy", "ID", "the policy of the licenses it creates"),
    option("name", "NAME", "a name shown in the status"),
    option("duration-days", "N", "license length for one-time prices (default: the policy's)"),
    JSON_OPTION,
  ],
  run(line) {
    const [action, argument, extra] = line.positionals;
    if (action === "add") {
      if (argument !== undefined) throw new UsageError(`unexpected argument ${argument}`);
      // Every flag is checked before the keystore opens: a mistake in one is a usage error (exit
      // 2), whatever state the data directory is in.
      const priceId = requiredFlag(line, "price");
      if (!PRICE_ID.test(priceId)) throw new UsageError("--price must be a price id, price_…");
      const productId = requiredFlag(line, "product");
      const policyId = requiredFlag(line, "policy");
      const name = stringFlag(line, "name");
      const nameProblem = name === undefined ? null : offeringNameProblem(name);
      if (nameProblem) throw new UsageError(`--name ${nameProblem}`);
      const days = stringFlag(line, "duration-days");
      if (days !== undefined && (!/^\d{1,6}$/.test(days) || Number(days) < 1))
        throw new UsageError("--duration-days must be a whole number of days, at least 1");
      const row = withBilling(line, (billing) =>
        billing.addOffering(
          {
            priceId,
            productId,
            policyId,
            name,
            licenseDurationDays: days === undefined ? undefined : Number(days),
          },
          cliActor(),
        ),
      );
      out(
        line.flags.json === true
          ? JSON.stringify(presentOffering(row))
          : `Offering ${row.id} added (${row.environment}).`,
      );
      return 0;
    }
    if (action === "list") {
      if (argument !== undefined) throw new UsageError(`unexpected argument ${argument}`);
      const rows = withBilling(line, (billing) => billing.offerings());
      if (line.flags.json === true)
        out(JSON.stringify(rows.map((row) => ({ ...presentOffering(row), environment: row.environment }))));
      else {
        out(
          table(
            ["ID", "ENV", "PRICE", "PRODUCT", "POLICY", "STATUS"],
            rows.map((row) => [
              row.id,
              row.environment,
              row.priceId,
              row.productId,
              row.policyId,
              row.status,
            ]),
          ),
        );
      }
      return 0;
    }
    if (action === "remove") {
      if (argument === undefined) throw new UsageError("give the offering id or price id to remove");
      if (extra !== undefined) throw new UsageError(`unexpected argument ${extra}`);
      const removed = withBilling(line, (billing) => billing.removeOffering(argument, cliActor()));
      if (!removed) throw new CliError(`no active offering ${argument}`);
      out(
        line.flags.json === true
          ? JSON.stringify(presentOffering(removed))
          : `Offering ${removed.id} removed; licenses it created stay.`,
      );
      return 0;
    }
    throw new UsageError(action === undefined ? "give add, list or remove" : `unknown action "${action}"`);
  },
};

export const billingDisableCommand: Command = {
  name: "billing disable",
  summary:
    "Stop receiving billing events and forget the API key and webhook secret (both modes unless --env).",
  usage: "licensing billing disable [--env live|test]",
  configKeys: CONFIG_KEYS,
  options: [option("env", "ENV", "only this environment's integration")],
  run(line) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const env = stringFlag(line, "env");
    if (env !== undefined && !ENVIRONMENTS.includes(env as Environment))
      throw new UsageError("--env must be live or test");
    const disabled = withBilling(line, (billing) =>
      billing.disable(env as Environment | undefined, cliActor()),
    );
    out(
      disabled.length > 0
        ? `Billing integration disabled: ${disabled.join(", ")}.`
        : "No active billing integration.",
    );
    return 0;
  },
};

/** The failure that needs fixing and resending, or when a resend was applied. */
const lastFailure = (failure: BillingIntegrationView["last_failure"]): string =>
  failure
    ? `${failure.type} ${failure.reason ?? "failed"} ${failure.at}${failure.resolved_at ? ` (resolved ${failure.resolved_at})` : ""}`
    : "-";

export const billingStatusCommand: Command = {
  name: "billing status",
  summary: "Show the billing integration of each environment, as GET /mgmt/v1/billing-integration does.",
  usage: "licensing billing status [--json]",
  configKeys: CONFIG_KEYS,
  options: [JSON_OPTION],
  run(line) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const statuses = withBilling(line, (billing) =>
      ENVIRONMENTS.map((environment) => billing.status(environment)),
    );
    if (line.flags.json === true) out(JSON.stringify(statuses));
    else {
      out(
        table(
          ["MODE", "STATUS", "OFFERINGS", "LAST EVENT", "LAST FAILURE", "UNRESOLVED"],
          statuses.map((s) => [
            s.mode,
            s.status,
            String(s.offerings.filter((o) => o.status === "active").length),
            s.last_event ? `${s.last_event.type} ${s.last_event.result} ${s.last_event.at}` : "-",
            lastFailure(s.last_failure),
            String(s.unresolved_failures),
          ]),
        ),
      );
    }
    return 0;
  },
};

export const billingCommands = [
  billingConfigureCommand,
  billingOfferingCommand,
  billingDisableCommand,
  billingStatusCommand,
];
