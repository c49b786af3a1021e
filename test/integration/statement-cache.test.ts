import { expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { eq, sql } from "drizzle-orm";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { usageCounters } from "../../src/store/schema/index.ts";

/**
 * Drizzle's client reuses compiled statements from a bounded cache (src/store/db.ts). A query
 * prepared once and kept (as the hot paths do) must keep working after its statement has been
 * pushed out of the cache by thousands of other SQL texts, and repeated texts must still bind
 * their own parameters.
 */
test("a kept prepared query outlives its eviction from the statement cache, and reused statements bind fresh values", () => {
  const dir = mkdtempSync(join(tmpdir(), "licensing-statements-"));
  const store = openStore(join(dir, "licensing.db"));
  try {
    migrate(store.sqlite);
    const kept = store.db
      .select({ count: usageCounters.count })
      .from(usageCounters)
      .where(eq(usageCounters.metric, sql.placeholder("metric")))
      .prepare();
    expect(kept.get({ metric: "cache_test" })).toBeUndefined();
    for (let i = 0; i < 2_500; i++) {
      const [row] = store.db.all<{ n: number }>(sql.raw(`SELECT ${i} AS n`));
      expect(row?.n).toBe(i);
    }
    store.sqlite.run(
      "INSERT INTO usage_counters (metric, period, count) VALUES ('cache_test', '2026-11', 7)",
    );
    expect(kept.get({ metric: "cache_test" })).toEqual({ count: 7 });
    for (const n of [1, 2, 3]) expect(store.db.all<{ n: number }>(sql`SELECT ${n} AS n`)[0]?.n).toBe(n);
  } finally {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
