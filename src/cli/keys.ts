import { Value } from "@sinclair/typebox/value";
import type { CommandLine } from "../config.ts";
import { systemClock } from "../domain/clock.ts";
import { IdGenerator } from "../domain/ids.ts";
import { ENVIRONMENTS, type Environment, isScope, SCOPES, type Scope } from "../domain/scopes.ts";
import { CONTROL_CHARACTERS, NameField } from "../http/schemas.ts";
import { ApiKeyService } from "../modules/api-keys/service.ts";
import { type OptionSpec, UsageError } from "./args.ts";
import { CliError, OutputError, out } from "./console.ts";
import { type Command, cliActor, JSON_OPTION, noPositionals, openExistingStore } from "./shared.ts";

/**
 * A key's name follows the API's rule for names (one line, 1-200 characters, no control
 * characters): `keys list` prints it to a terminal, where an ESC or a line break would forge
 * output. The schema itself is used, so the two cannot drift apart.
 */
const KEY_NAME = NameField();

/**
 * The commands open the store directly, so they work while the server runs (WAL + busy_timeout).
 * Keys are stored as hashes, so no keystore (and no passphrase) is needed.
 */
function withApiKeys<T>(line: CommandLine, work: (service: ApiKeyService) => T): T {
  const { store } = openExistingStore(line.config.dataDir);
  try {
    return work(
      new ApiKeyService({ db: store.db, sqlite: store.sqlite, clock: systemClock, ids: new IdGenerator() }),
    );
  } finally {
    store.close();
  }
}

export function parseScopes(value: string): Scope[] {
  if (value === "all") return [...SCOPES];
  const names = value
    .split(",")
    .map((name) => name.trim())
    .filter(Boolean);
  const unknown = names.filter((name) => !isScope(name));
  if (names.length === 0 || unknown.length > 0) {
    throw new UsageError(
      `${unknown.length > 0 ? `unknown scope ${unknown.join(", ")}` : "no scopes given"}; ` +
        `use "all" or a comma-separated list of: ${SCOPES.join(", ")}`,
    );
  }
  return [...new Set(names as Scope[])];
}

const CREATE_OPTIONS: OptionSpec[] = [
  { name: "env", kind: "string", valueName: "live|test", description: "environment the key acts in" },
  {
    name: "scopes",
    kind: "string",
    valueName: "all|a,b",
    description: `"all", or a comma-separated list of: ${SCOPES.join(", ")}`,
  },
  { name: "name", kind: "string", valueName: "NAME", description: "a label for the key" },
  JSON_OPTION,
];

const SHARED_KEYS = ["dataDir"] as const;

export const keysCreateCommand: Command = {
  name: "keys create",
  summary: "Create a management API key. The key is printed once and only its hash is stored.",
  usage: "licensing keys create --env live|test --scopes all|a,b [--name NAME] [--json] [--data-dir DIR]",
  configKeys: SHARED_KEYS,
  options: CREATE_OPTIONS,
  run(line) {
    noPositionals(line);
    const env = line.flags.env;
    if (typeof env !== "string") throw new UsageError("--env is required (live or test)");
    if (!(ENVIRONMENTS as readonly string[]).includes(env)) {
      throw new UsageError(`--env must be live or test, not "${env}"`);
    }
    const scopesFlag = line.flags.scopes;
    if (typeof scopesFlag !== "string") throw new UsageError('--scopes is required ("all" or a list)');
    const scopes = parseScopes(scopesFlag);
    const name = typeof line.flags.name === "string" ? line.flags.name.trim() : `${env} key`;
    if (!Value.Check(KEY_NAME, name)) throw new UsageError(`--name ${KEY_NAME["x-rule"]}`);
    const created = withApiKeys(line, (service) =>
      service.create({ environment: env as Environment, scopes, name }, cliActor()),
    );
    try {
      if (line.flags.json === true) out(JSON.stringify({ api_key: created.apiKey, id: created.id }));
      else out(`Created ${created.id} (${env}, ${scopesFlag}).\nAPI key (shown only now): ${created.apiKey}`);
    } catch (error) {
      // The key is live and stored only as a hash: unprinted, nobody can ever use it, but it stays
      // valid until revoked.
      if (error instanceof OutputError)
        throw new CliError(
          `created API key ${created.id} but could not print it (${error.reason}); nobody has seen the key: ` +
            `revoke it with "licensing keys revoke ${created.id}" and create another`,
        );
      throw error;
    }
    return 0;
  },
};

export const keysListCommand: Command = {
  name: "keys list",
  summary: "List management API keys (never the keys themselves, only a hint).",
  usage: "licensing keys list [--json] [--data-dir DIR]",
  configKeys: SHARED_KEYS,
  options: [JSON_OPTION],
  run(line) {
    noPositionals(line);
    const keys = withApiKeys(line, (service) => service.list());
    if (line.flags.json === true) {
      out(JSON.stringify(keys));
      return 0;
    }
    if (keys.length === 0) {
      out("No API keys.");
      return 0;
    }
    const rows = keys.map((key) => [
      key.id,
      key.environment,
      key.revoked_at ? `revoked ${key.revoked_at}` : "active",
      key.scopes.length === SCOPES.length ? "all" : key.scopes.join(","),
      key.hint,
      printable(key.name),
    ]);
    out(table(["ID", "ENV", "STATUS", "SCOPES", "HINT", "NAME"], rows));
    return 0;
  },
};

export const keysRevokeCommand: Command = {
  name: "keys revoke",
  summary: "Revoke a management API key; requests with it get 401 from then on.",
  usage: "licensing keys revoke ID [--data-dir DIR]",
  configKeys: SHARED_KEYS,
  options: [],
  run(line) {
    const [id] = line.positionals;
    if (id === undefined) throw new UsageError("give the id of the key to revoke (see licensing keys list)");
    noPositionals(line, 1);
    // The key itself instead of its id: echoing it would put a live secret into terminals, logs
    // and CI output. `lsk_` marks a key wherever it stands, as in the request log's redaction.
    if (id.includes("lsk_")) {
      throw new UsageError(
        "that looks like an API key, not its id: give the key_… id that licensing keys list shows",
      );
    }
    const found = withApiKeys(line, (service) => service.revoke(id, cliActor()));
    if (!found) throw new CliError(`no API key with id ${id}`);
    out(`Revoked ${id}.`);
    return 0;
  },
};

export const keysCommands = [keysCreateCommand, keysListCommand, keysRevokeCommand];

const CONTROL = new RegExp(`[${CONTROL_CHARACTERS}]`, "g");

/**
 * A name as the table shows it: control characters escaped (`\u001b`), so a name stored before
 * the name rule applied cannot move the cursor, recolour or break the listing.
 */
function printable(text: string): string {
  return text.replace(CONTROL, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

export function table(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => (row[i] ?? "").length)));
  const line = (cells: string[]) =>
    cells
      .map((cell, i) => (i === cells.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd();
  return [line(header), ...rows.map(line)].join("\n");
}
