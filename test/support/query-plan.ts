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

const RUNNING = new Set(["all", "get", "run", "values", "iterate"]);

/**
 * Records every statement `target` runs from now until `stop()`: the statements it prepares (also
 * those it hands out again from its cache) are wrapped, so a test counts how many statements a
 * code path runs and how many rows they return, whatever the data. For work that must not grow
 * with a table: count once small, once large, and compare.
 */
export function recordStatementRuns(target: Preparing): {
  runs: { sql: string; rows: number }[];
  stop: () => void;
} {
  const runs: { sql: string; rows: number }[] = [];
  const saved = METHODS.map((name) => [name, Object.getOwnPropertyDescriptor(target, name)] as const);
  for (const name of METHODS) {
    const original = target[name] as (this: unknown, ...args: unknown[]) => object;
    (target as unknown as Record<string, unknown>)[name] = function (this: unknown, ...args: unknown[]) {
      const sql = String(args[0]);
      const statement = original.apply(this, args);
      return new Proxy(statement, {
        get(inner, property) {
          const value = Reflect.get(inner, property, inner);
          if (typeof value !== "function" || !RUNNING.has(String(property))) return value;
          return (...params: unknown[]) => {
            const result = (value as (...p: unknown[]) => unknown).apply(inner, params);
            runs.push({ sql, rows: Array.isArray(result) ? result.length : result ? 1 : 0 });
            return result;
          };
        },
      });
    };
  }
  const stop = () => {
    for (const [name, descriptor] of saved) {
      if (descriptor) Object.defineProperty(target, name, descriptor);
      else delete (target as unknown as Record<string, unknown>)[name];
    }
  };
  return { runs, stop };
}
