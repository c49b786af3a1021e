import type { Database } from "bun:sqlite";
import { createHash } from "node:crypto";

/**
 * What a refused request may still write, by design, and so is left out of the digest:
 * - `runtime_events`: the log of refused runtime calls (checked separately by the fuzz test);
 * - `usage_counters`: the plan's request meter, which counts every admitted call;
 * - `api_keys.last_used_at` / `usage_count`: the operator's hint of when a key was last used.
 */
const EXCLUDED_TABLES = new Set(["runtime_events", "usage_counters"]);
const EXCLUDED_COLUMNS: Record<string, Set<string>> = { api_keys: new Set(["last_used_at", "usage_count"]) };

const quote = (name: string) => `"${name.replaceAll('"', '""')}"`;

/**
 * A digest of every row of every table (a table added later is included automatically), cheap
 * enough to take around each request of a small test store.
 */
export function storeDigest(sqlite: Database): string {
  const hash = createHash("sha256");
  const tables = sqlite
    .query<{ name: string }, []>(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .all()
    .map((row) => row.name)
    .filter((name) => !EXCLUDED_TABLES.has(name));
  for (const table of tables) {
    const skip = EXCLUDED_COLUMNS[table];
    const columns = sqlite
      .query<{ name: string }, [string]>("SELECT name FROM pragma_table_info(?)")
      .all(table)
      .map((row) => row.name)
      .filter((name) => !skip?.has(name));
    // Ordered by every column, so tables without a rowid digest the same way.
    const order = columns.map((_, i) => i + 1).join(", ");
    const rows = sqlite
      .query(`SELECT ${columns.map(quote).join(", ")} FROM ${quote(table)} ORDER BY ${order}`)
      .values();
    hash
      .update(table)
      .update(
        JSON.stringify(rows, (_key, value) =>
          value instanceof Uint8Array ? Buffer.from(value).toString("hex") : value,
        ),
      );
  }
  return hash.digest("hex");
}

export interface RuntimeEventRow {
  id: string;
  code: string;
  http_status: number;
  occurrences: number;
  last_request_id: string;
}

export function runtimeEvents(sqlite: Database): Map<string, RuntimeEventRow> {
  const rows = sqlite
    .query<RuntimeEventRow, []>(
      "SELECT id, code, http_status, occurrences, last_request_id FROM runtime_events",
    )
    .all();
  return new Map(rows.map((row) => [row.id, row]));
}
