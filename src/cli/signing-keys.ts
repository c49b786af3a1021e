import { eq } from "drizzle-orm";
import type { CommandLine } from "../config.ts";
import { KEY_ID } from "../crypto/keys.ts";
import type { Deps } from "../deps.ts";
import { isoSeconds, unixSeconds } from "../domain/clock.ts";
import type { InvalidatedPackages } from "../modules/trust/retention.ts";
import { SigningKeyError, TrustService } from "../modules/trust/service.ts";
import { products } from "../store/schema/index.ts";
import { UsageError } from "./args.ts";
import { CliError, out } from "./console.ts";
import { table } from "./keys.ts";
import {
  type Command,
  cliActor,
  JSON_OPTION,
  KEYSTORE_CONFIG_KEYS,
  noPositionals,
  PRODUCT_OPTION,
  productFlag,
  withKeystoreDeps,
} from "./shared.ts";

/** Signing keys live in the keystore; a running server picks a change up. */
function withTrust<T>(line: CommandLine, work: (trust: TrustService, deps: Deps) => T): T {
  return withKeystoreDeps(line, (deps) => work(new TrustService(deps), deps));
}

function productEnvironment(deps: Deps, productId: string) {
  const product = deps.db.select().from(products).where(eq(products.id, productId)).get();
  if (!product) throw new CliError(`no product ${productId}`);
  return product.environment;
}

export const signingKeysListCommand: Command = {
  name: "signing-keys list",
  summary: "List a product's signing keys and their status in its trust bundle.",
  usage: "licensing signing-keys list --product ID [--json] [--data-dir DIR]",
  configKeys: KEYSTORE_CONFIG_KEYS,
  options: [PRODUCT_OPTION, JSON_OPTION],
  run(line) {
    const productId = productFlag(line);
    noPositionals(line);
    const keys = withTrust(line, (trust, deps) => {
      productEnvironment(deps, productId);
      return trust.signingKeys(productId);
    });
    const rows = keys.map((k) => ({
      key_id: k.keyId,
      status: k.status,
      public_key: k.publicKey,
      not_before: k.notBefore,
      not_after: k.notAfter,
    }));
    if (line.flags.json === true) out(JSON.stringify(rows));
    else {
      out(
        table(
          ["KEY", "STATUS", "NOT BEFORE", "NOT AFTER"],
          rows.map((r) => [
            r.key_id,
            r.status,
            isoSeconds(r.not_before),
            r.not_after === null ? "-" : isoSeconds(r.not_after),
          ]),
        ),
      );
    }
    return 0;
  },
};

export const signingKeysRotateCommand: Command = {
  name: "signing-keys rotate",
  summary:
    "Give a product a new signing key. The old one is retired and stays in the trust bundle for --retain-days (default: until every certificate it signed, network grace included, and every offline package it signed has expired).",
  usage: "licensing signing-keys rotate --product ID [--retain-days N] [--json] [--data-dir DIR]",
  configKeys: KEYSTORE_CONFIG_KEYS,
  options: [
    PRODUCT_OPTION,
    {
      name: "retain-days",
      kind: "string",
      valueName: "N",
      description:
        "days the retired key stays in the bundle (shorter than the default invalidates what it signed)",
    },
    JSON_OPTION,
  ],
  run(line) {
    const productId = productFlag(line);
    // `rotate --product P 30` meant --retain-days 30; silently taking the default instead would
    // keep the old key listed for another length of time than the operator asked for.
    noPositionals(line);
    const retainFlag = line.flags["retain-days"];
    let retainSec: number | undefined;
    if (typeof retainFlag === "string") {
      if (!/^\d{1,4}$/.test(retainFlag)) throw new UsageError("--retain-days must be a whole number of days");
      retainSec = Number(retainFlag) * 86_400;
    }
    const result = withTrust(line, (trust, deps) => {
      productEnvironment(deps, productId);
      const rotation = keyChange(() => trust.rotate(productId, { retainSec, actor: cliActor() }));
      return { ...rotation, at: unixSeconds(deps.clock.now()) };
    });
    if (line.flags.json === true) out(JSON.stringify(result));
    else {
      const lines = [
        `New signing key ${result.key_id}; trust bundle sequence ${result.trust_bundle_sequence}.`,
      ];
      const retired = result.retired;
      if (retired) {
        lines.push(
          `Key ${retired.key_id} is retired and stays in the trust bundle until ${isoSeconds(retired.not_after)}.`,
        );
        // Say what set the date, so an operator can tell what keeps a key listed for years.
        if (retainSec === undefined)
          lines.push(retentionReason(retired.unexpired_offline_packages, retired.not_after));
        const usableUntil = retired.certificates_usable_until;
        if (usableUntil !== null && usableUntil > retired.not_after)
          lines.push(
            `Warning: certificates signed by ${retired.key_id} may stay usable until ${isoSeconds(usableUntil)} (the longest cert_ttl_sec of the product's policies, plus network_grace_sec where a policy fails open); devices that fetch the new trust bundle take them for invalid from ${isoSeconds(retired.not_after)} on, grace or not, so one that cannot reach the service for a new certificate stops working then. Leave out --retain-days to keep the key listed that long.`,
          );
        const lost = retired.invalidated_offline_packages;
        if (lost.count > 0)
          lines.push(
            `Warning: ${packages(lost.count)} signed by ${retired.key_id} ${lost.count === 1 ? "is" : "are"} valid until ${isoSeconds(lost.latest_expires_at ?? retired.not_after)} at the latest; devices that fetch a trust bundle without the key refuse ${lost.count === 1 ? "it" : "them"} after ${isoSeconds(retired.not_after)}. Leave out --retain-days to keep the key listed until they expire.`,
          );
      }
      out(lines.join("\n"));
    }
    return 0;
  },
};

export const signingKeysRetireCommand: Command = {
  name: "signing-keys retire",
  summary:
    "Retire a signing key now, or mark it --compromised: devices then refuse everything it signed. The product needs another active key first (rotate).",
  usage: "licensing signing-keys retire KEY_ID [--compromised] [--data-dir DIR]",
  configKeys: KEYSTORE_CONFIG_KEYS,
  options: [{ name: "compromised", kind: "boolean", description: "the key leaked: list it as compromised" }],
  run(line) {
    const [keyId, extra] = line.positionals;
    if (keyId === undefined) throw new UsageError("give the key id (see licensing signing-keys list)");
    if (extra !== undefined) throw new UsageError(`unexpected argument ${extra}`);
    if (!KEY_ID.test(keyId))
      throw new UsageError("the key id must be k_ and 20 hex characters (see licensing signing-keys list)");
    const compromised = line.flags.compromised === true;
    const result = withTrust(line, (trust) =>
      keyChange(() => trust.retire(keyId, { compromised, actor: cliActor() })),
    );
    const lines = [
      `Key ${keyId} ${compromised ? "marked compromised" : "retired"}; trust bundle sequence ${result.trust_bundle_sequence}.`,
    ];
    const lost = result.invalidated_offline_packages;
    if (lost.count > 0)
      lines.push(
        `${packages(lost.count)} it signed (valid until ${isoSeconds(lost.latest_expires_at ?? 0)} at the latest) ${lost.count === 1 ? "is" : "are"} refused from now on by devices that fetch the new trust bundle.`,
      );
    out(lines.join("\n"));
    return 0;
  },
};

/** The service refuses what the key's state does not allow; the operator gets one line, not a stack. */
function keyChange<T>(change: () => T): T {
  try {
    return change();
  } catch (error) {
    if (error instanceof SigningKeyError) throw new CliError(error.message);
    throw error;
  }
}

/** Why the default retention ends when it does: the last package it signed, or a certificate lifetime. */
function retentionReason(pinning: InvalidatedPackages, notAfter: number): string {
  const revoked = "(packages of revoked licenses do not count)";
  if (pinning.count > 0 && pinning.latest_expires_at === notAfter)
    return `That is when the last of the ${packages(pinning.count)} it signed expires ${revoked}.`;
  const packagesToo =
    pinning.count > 0
      ? `; the ${packages(pinning.count)} it signed expire by ${isoSeconds(pinning.latest_expires_at ?? notAfter)}`
      : `; it signed no unexpired offline package ${revoked}`;
  return `That covers the longest certificate the product's policies sign, network grace included${packagesToo}.`;
}

const packages = (count: number) => `${count} unexpired offline package${count === 1 ? "" : "s"}`;

export const signingKeysCommands = [
  signingKeysListCommand,
  signingKeysRotateCommand,
  signingKeysRetireCommand,
];
