import type { Database } from "bun:sqlite";

type Preparing = Pick<Database, "prepare" | "query">;
const METHODS = ["prepare", "query"] as const;

/**
 * The SQL `target` is asked to prepare (through `prepare` or `query`) while `run` runs: a
 * connection, or `Database.prototype` for the statements of connections opened during `run`
 * (services prepare their hot statements when they are made). Drizzle prepares every query it
 * runs, so a test finds here the statement a code path uses and asks for its plan.
 */
export async function sqlPreparedDuring<T>(
  target: Preparing,
  run: () => T | Promise<T>,
): Promise<{ result: T; sql: string[] }> {
  const sql: string[] = [];
  const saved = METHODS.map((name) => [name, Object.getOwnPropertyDescriptor(target, name)] as const);
  for (const name of METHODS) {
    const original = target[name] as (this: unknown, ...args: unknown[]) => unknown;
    (target as unknown as Record<string, unknown>)[name] = function (this: unknown, ...args: unknown[]) {
      sql.push(String(args[0]));
      return original.apply(this, args);
    };
  }
  try {
    return { result: await run(), sql };
  } finally {
    for (const [name, descriptor] of saved) {
      if (descriptor) Object.defineProperty(target, name, descriptor);
      else delete (target as unknown as Record<string, unknown>)[name];
    }
  }
}

/** SQLite's plan for `sql`, its steps joined by " | " (`SEARCH t USING INDEX i (a=?) | USE TEMP B-TREE FOR ORDER BY`). */
export function queryPlan(sqlite: Database, sql: string): string {
  return sqlite
    .query<{ detail: string }, []>(`EXPLAIN QUERY PLAN ${sql}`)
    .all()
    .map((step) => step.detail)
    .join(" | ");
}
