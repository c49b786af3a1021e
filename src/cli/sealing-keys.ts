import type { CommandLine } from "../config.ts";
import { KEY_ID } from "../crypto/keys.ts";
import {
  presentSealingKey,
  SealingKeyError,
  SealingKeyLifecycle,
  type SealingKeyView,
} from "../modules/sealed-files/lifecycle.ts";
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

/**
 * Sealing keys' private halves live in the keystore, so these commands need the passphrase, as
 * `licensing signing-keys` does. A running server reads the key rows on every key release and
 * status request, so it acts on a change at once, without a restart.
 */
function withLifecycle<T>(line: CommandLine, work: (lifecycle: SealingKeyLifecycle) => T): T {
  return withKeystoreDeps(line, (deps) => {
    try {
      return work(new SealingKeyLifecycle(deps));
    } catch (error) {
      // The state of the keys refused the change; the operator gets one line, not a stack.
      if (error instanceof SealingKeyError) throw new CliError(error.message);
      throw error;
    }
  });
}

interface ListedKey extends SealingKeyView {
  /** Whether the keystore holds its private half (false once a compromise removed it). */
  private_key_held: boolean;
}

export const sealingKeysListCommand: Command = {
  name: "sealing-keys list",
  summary:
    "List a product's sealed-file sealing keys, newest first: status, which one is current, and each public sealing_key line.",
  usage: "licensing sealing-keys list --product ID [--json] [--data-dir DIR]",
  configKeys: KEYSTORE_CONFIG_KEYS,
  options: [PRODUCT_OPTION, JSON_OPTION],
  run(line) {
    const productId = productFlag(line);
    noPositionals(line);
    const keys: ListedKey[] = withLifecycle(line, (lifecycle) =>
      lifecycle.keys(productId).map((row) => ({
        ...presentSealingKey(row),
        private_key_held: lifecycle.holdsPrivateHalf(row.keyId),
      })),
    );
    if (line.flags.json === true) {
      out(JSON.stringify(keys));
      return 0;
    }
    if (keys.length === 0) {
      out(
        `${productId} has no sealing key: sealed files are not enabled for it ` +
          `(enable them with POST /mgmt/v1/products/${productId}/sealed-files).`,
      );
      return 0;
    }
    const rows = keys.map((k) => [
      k.key_id,
      k.current ? `${k.status} (current)` : k.status,
      k.created_at,
      k.retired_at ?? "-",
      k.private_key_held ? "held" : "removed",
    ]);
    const current = keys.find((k) => k.current);
    out(
      [
        table(["KEY", "STATUS", "CREATED", "RETIRED", "PRIVATE HALF"], rows),
        "",
        ...keys.map((k) => `${k.key_id} ${k.sealing_key}`),
        ...(current ? ["", `Seal new files to the current key: ${current.sealing_key}`] : []),
      ].join("\n"),
    );
    return 0;
  },
};

export const sealingKeysRotateCommand: Command = {
  name: "sealing-keys rotate",
  summary:
    "Give a product a new current sealing key, which new files are sealed to. The older keys stay active: files sealed to them keep opening until you retire them.",
  usage: "licensing sealing-keys rotate --product ID [--json] [--data-dir DIR]",
  configKeys: KEYSTORE_CONFIG_KEYS,
  options: [PRODUCT_OPTION, JSON_OPTION],
  run(line) {
    const productId = productFlag(line);
    noPositionals(line);
    const result = withLifecycle(line, (lifecycle) => lifecycle.rotate(productId, cliActor()));
    if (line.flags.json === true) out(JSON.stringify(result));
    else {
      out(
        [
          `New current sealing key ${result.key_id}; seal new files to:`,
          result.sealing_key,
          `Key ${result.previous_key_id} stays active: files sealed to it keep opening until you re-seal them and run`,
          `  licensing sealing-keys retire --product ${productId} --key ${result.previous_key_id}`,
        ].join("\n"),
      );
    }
    return 0;
  },
};

export const sealingKeysRetireCommand: Command = {
  name: "sealing-keys retire",
  summary:
    "Stop a sealing key releasing data keys: files sealed to it are refused (retired_key). With --compromised they are refused as compromised_key and the key's private half is removed from the keystore. The current key cannot be retired: rotate first.",
  usage: "licensing sealing-keys retire --product ID --key KEY_ID [--compromised] [--json] [--data-dir DIR]",
  configKeys: KEYSTORE_CONFIG_KEYS,
  options: [
    PRODUCT_OPTION,
    { name: "key", kind: "string", valueName: "KEY_ID", description: "the sealing key (k_…, see list)" },
    {
      name: "compromised",
      kind: "boolean",
      description: "the private key may have leaked: refuse its files as compromised and remove it",
    },
    JSON_OPTION,
  ],
  run(line) {
    const productId = productFlag(line);
    noPositionals(line);
    const keyId = line.flags.key;
    if (typeof keyId !== "string" || keyId === "")
      throw new UsageError("--key is required (see licensing sealing-keys list)");
    if (!KEY_ID.test(keyId))
      throw new UsageError(`--key ${keyId} is not a key id (k_ and 20 hex characters)`);
    const compromised = line.flags.compromised === true;
    const result = withLifecycle(line, (lifecycle) =>
      lifecycle.retire(productId, keyId, { compromised, actor: cliActor() }),
    );
    if (line.flags.json === true) out(JSON.stringify(result));
    else {
      const refused = compromised ? "compromised_key" : "retired_key";
      out(
        [
          `Key ${keyId} ${compromised ? "marked compromised" : "retired"}: files sealed to it are refused from now on (${refused}).`,
          ...(compromised
            ? [`Its private half is removed from the keystore; backups taken before still hold it.`]
            : []),
          "Devices that already opened such a file may keep its data key; re-seal the files to the current key.",
        ].join("\n"),
      );
    }
    return 0;
  },
};

export const sealingKeysCommands = [
  sealingKeysListCommand,
  sealingKeysRotateCommand,
  sealingKeysRetireCommand,
];
