import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";

export interface EmbeddedMigration {
  tag: string;
  when: number;
  hash: string;
  statements: string[];
}

/**
 * Runs at bundle time (imported `with { type: "macro" }`): the SQL that drizzle-kit generated is
 * inlined into the executable, because a compiled binary has no db/migrations folder to read.
 */
export function embeddedMigrations(): EmbeddedMigration[] {
  const folder = join(import.meta.dir, "../../db/migrations");
  const journal = JSON.parse(readFileSync(join(folder, "meta/_journal.json"), "utf8")) as {
    entries: { tag: string; when: number }[];
  };
  return journal.entries.map((entry) => {
    const sql = readFileSync(join(folder, `${entry.tag}.sql`), "utf8");
    return {
      tag: entry.tag,
      when: entry.when,
      hash: createHash("sha256").update(sql).digest("hex"),
      statements: sql
        .split("--> statement-breakpoint")
        .map((s) => s.trim())
        .filter(Boolean),
    };
  });
}
