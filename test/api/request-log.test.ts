import { afterAll, beforeAll, expect, test } from "bun:test";
import { resolveConfig } from "../../src/config.ts";
import { jsonLogger, MAX_LOGGED_PATH } from "../../src/http/logger.ts";
import { type RunningServer, startServer } from "../../src/server.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";

/**
 * A request's log line is as long as its path, which the client chooses: the path it holds is cut
 * at MAX_LOGGED_PATH characters, with a mark saying so, so a 16,000-character path no longer
 * writes a 16 KB line per request.
 */
let t: TestContext;
beforeAll(() => {
  t = createTestContext();
});
afterAll(() => t.close());

test("the request log line holds a long path cut, marked as cut, and a short one whole", async () => {
  const lines: string[] = [];
  const server: RunningServer = startServer({
    config: { ...resolveConfig({ "data-dir": t.dir }, {}, t.dir), port: 0 },
    passphrase: "test passphrase",
    logger: jsonLogger("debug", (line) => lines.push(line) > 0),
  });
  const long = `/runtime/v1/${"a".repeat(16_000)}`;
  const short = "/runtime/v1/short-path";
  try {
    expect((await fetch(`${server.url}${long}`)).status).toBe(404);
    expect((await fetch(`${server.url}${short}`)).status).toBe(404);
  } finally {
    await server.shutdown("test");
  }
  const paths = lines
    .map((line) => JSON.parse(line) as { msg: string; path?: string })
    .filter((entry) => entry.msg === "request")
    .map((entry) => entry.path as string);
  expect(paths).toHaveLength(2);
  const [cut, whole] = paths as [string, string];
  expect(cut).toBe(`${long.slice(0, MAX_LOGGED_PATH)}…[cut: ${long.length} characters]`);
  expect(whole).toBe(short);
  for (const line of lines) expect(line.length).toBeLessThan(2 * 1024);
});
