import { expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

/**
 * The documents' shell examples share the README walkthrough's names (`$KEY`, `$B`, `$PRODUCT`),
 * so a reader who ran it can paste any later example as it stands.
 */
const ROOT = join(import.meta.dir, "../..");
const DOCUMENTS = ["README.md", ...readdirSync(join(ROOT, "docs")).map((name) => `docs/${name}`)].filter(
  (path) => path.endsWith(".md"),
);

const shellBlocks = (markdown: string): string[] =>
  [...markdown.matchAll(/```(?:sh|bash|shell)\n(.*?)```/gs)].map((m) => m[1] ?? "");
/** `NAME=` at a line's start or after a space or `;`, as assignments (several on a line) are. */
const assigned = (script: string) =>
  new Set([...script.matchAll(/(?:^|[\s;])([A-Za-z_][A-Za-z0-9_]*)=/gm)].map((m) => m[1] as string));
const used = (script: string) =>
  [...script.matchAll(/\$\{?([A-Za-z_][A-Za-z0-9_]*)/g)].map((m) => m[1] as string);

test("every variable a shell example uses is set by the README's walkthrough or by the example itself", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const walkthrough = readme.slice(readme.indexOf("### From a key to an activated device"));
  const shared = assigned(shellBlocks(walkthrough)[0] ?? "");
  expect([...shared]).toEqual(expect.arrayContaining(["KEY", "B", "PRODUCT"]));
  const unknown: string[] = [];
  let examples = 0;
  for (const path of DOCUMENTS) {
    for (const block of shellBlocks(readFileSync(join(ROOT, path), "utf8"))) {
      examples++;
      const own = assigned(block);
      for (const name of used(block))
        if (!shared.has(name) && !own.has(name)) unknown.push(`${path}: $${name}`);
    }
  }
  expect(examples).toBeGreaterThan(5);
  expect(unknown).toEqual([]);
});

test("the check above finds a variable the walkthrough does not set", () => {
  const block = 'curl -H "Authorization: Bearer $KEY" "$BASE/mgmt/v1/products"';
  expect(used(block).filter((name) => !assigned("KEY=x\nB=y").has(name))).toEqual(["BASE"]);
});
