/**
 * Checks every answer the test suite recorded (LICENSING_OPENAPI_RECORD, test/support/harness.ts)
 * against the OpenAPI document the app serves, and fails listing what the document gets wrong:
 * an undeclared status, a body its schema refuses or a member it leaves out, an undeclared
 * header. Run by .ci/run after `npm test`:
 *
 *   LICENSING_OPENAPI_RECORD=/tmp/answers.jsonl npm test && bun test/tools/openapi-audit.ts /tmp/answers.jsonl
 *
 * Left out: the pages the document leaves out on purpose (/, /docs, /openapi.json, /metrics, the
 * test clock), HEAD and OPTIONS (answered by the HTTP layer for every GET and runtime route), and
 * a path no route has that answers an error (tests probing unknown paths; that every route is in
 * the document and every documented path a route, test/api/fuzz.test.ts and openapi.test.ts
 * check). A path given with a trailing slash is the same route as without.
 */
import { readFileSync } from "node:fs";
import { createTestContext } from "../support/harness.ts";
import { OpenApiTruth } from "../support/openapi-truth.ts";

interface RecordedAnswer {
  method: string;
  path: string;
  status: number;
  headers: Record<string, string>;
  body: unknown;
}

const HIDDEN = [/^\/$/, /^\/docs(\/|$)/, /^\/openapi\.json$/, /^\/metrics$/, /^\/testing\//];

const file = process.argv[2];
if (!file) {
  console.error("usage: bun test/tools/openapi-audit.ts <answers.jsonl>");
  process.exit(2);
}

const context = createTestContext();
const truth = new OpenApiTruth((await context.call("GET", "/openapi.json", { key: null })).body);
context.close();

const problems = new Map<string, { count: number; example: string }>();
let checked = 0;
for (const line of readFileSync(file, "utf8").split("\n")) {
  if (line === "") continue;
  const answer = JSON.parse(line) as RecordedAnswer;
  const [rawPath = "", query] = answer.path.split("?");
  const path = rawPath.length > 1 ? rawPath.replace(/\/$/, "") : rawPath;
  if (answer.method === "HEAD" || answer.method === "OPTIONS" || HIDDEN.some((hidden) => hidden.test(path)))
    continue;
  if (!truth.templateOf(answer.method, path) && answer.status >= 400) continue;
  checked++;
  const headers = new Headers(answer.headers);
  const url = query === undefined ? path : `${path}?${query}`;
  for (const problem of truth.mismatches(answer.method, url, {
    status: answer.status,
    headers,
    body: answer.body,
  })) {
    const seen = problems.get(problem);
    if (seen) seen.count++;
    else problems.set(problem, { count: 1, example: `${answer.method} ${answer.path}` });
  }
}

console.log(`OpenAPI audit: ${checked} recorded answers checked against the document`);
if (checked === 0) {
  console.error("no answers were recorded: was the suite run with LICENSING_OPENAPI_RECORD?");
  process.exit(1);
}
for (const [problem, { count, example }] of [...problems].sort()) {
  console.error(`  ${problem} (${count}x; e.g. ${example})`);
}
if (problems.size > 0) {
  console.error(`the OpenAPI document does not describe ${problems.size} kinds of answer the tests saw`);
  process.exit(1);
}
