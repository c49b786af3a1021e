import { Database } from "bun:sqlite";
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { createTestContext } from "../support/harness.ts";

/**
 * The usage meter writes answered calls within 5 seconds even when no further request comes
 * (docs/api.md: "every 100 requests or 5 seconds, and at shutdown"): a server killed with
 * SIGKILL after a quiet spell has lost none of them. The server is a real process run from the
 * sources over a test context's store; this process only reads the store file.
 */
const MAIN = join(import.meta.dir, "../../src/main.ts");
/** Well past the 5 seconds: the write is waited for, not slept on, so this only bounds a failure. */
const WRITTEN_WITHIN_MS = 12_000;

const t = createTestContext();
afterAll(() => t.close());

const storedManagementRequests = (sqlite: Database) =>
  sqlite
    .query<{ n: number }, []>(
      "SELECT coalesce(sum(count), 0) AS n FROM usage_counters WHERE metric = 'management_requests'",
    )
    .get()?.n ?? 0;

async function freePort(): Promise<number> {
  const probe = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null) });
  const port = probe.port;
  await probe.stop(true);
  if (port === undefined) throw new Error("no free port");
  return port;
}

test("management calls answered before a quiet spell are in the store within seconds, and a kill -9 then loses none", async () => {
  const port = await freePort();
  const child = Bun.spawn([process.execPath, MAIN, "serve", "--data-dir", t.dir, "--port", String(port)], {
    stdout: "pipe",
    stderr: "pipe",
    env: { PATH: Bun.env.PATH, LICENSING_KEYSTORE_PASSPHRASE: "test passphrase" },
  });
  try {
    let stdout = "";
    const decoder = new TextDecoder();
    for await (const chunk of child.stdout) {
      stdout += decoder.decode(chunk, { stream: true });
      if (stdout.includes("listening on")) break;
    }
    expect(stdout).toContain("listening on");
    const before = storedManagementRequests(t.deps.sqlite);
    const calls = 10;
    for (let i = 0; i < calls; i++) {
      const answer = await fetch(`http://127.0.0.1:${port}/mgmt/v1/products`, {
        headers: { authorization: `Bearer ${t.keys.live}` },
      });
      expect(answer.status).toBe(200);
    }
    // The plan report is not counted: polling it must not be what writes the counts.
    const plan = await fetch(`http://127.0.0.1:${port}/mgmt/v1/plan`, {
      headers: { authorization: `Bearer ${t.keys.live}` },
    });
    expect((await plan.json()).data.quotas.management_requests.used).toBe(before + calls);

    // No request from here on: only the server's own timer can write what is still pending.
    const deadline = performance.now() + WRITTEN_WITHIN_MS;
    while (storedManagementRequests(t.deps.sqlite) < before + calls && performance.now() < deadline) {
      await Bun.sleep(100);
    }
    child.kill("SIGKILL");
    await child.exited;
    const reopened = new Database(join(t.dir, "licensing.db"), { readonly: true });
    try {
      expect(storedManagementRequests(reopened)).toBe(before + calls);
    } finally {
      reopened.close();
    }
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
    await child.exited;
  }
}, 30_000);
