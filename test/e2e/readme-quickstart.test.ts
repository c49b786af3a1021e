import { afterAll, expect, test } from "bun:test";
import { readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { BUILD_TIMEOUT_MS, removeTempDirs, type ServerProcess, startServe, tempDir } from "./binary.ts";

/**
 * The README's way from an API key to an activated device, run as written against the executable:
 * its shell block with curl and node, its app with the SDK, its `npx bun` line. Only the key and
 * the address change (the server listens on a free port, not 8080). A README step that stops
 * working fails here.
 */
const ROOT = join(import.meta.dir, "../..");
const README = readFileSync(join(ROOT, "README.md"), "utf8");

function walkthroughBlocks(): { shell: string; app: string; run: string } {
  const start = README.indexOf("### From a key to an activated device");
  const end = README.indexOf("\n## ", start);
  if (start < 0 || end < 0) throw new Error("README.md has no walkthrough section");
  const blocks = [...README.slice(start, end).matchAll(/```(\w+)\n(.*?)```/gs)].map((m) => ({
    lang: m[1],
    text: m[2] ?? "",
  }));
  const [shell, app, run] = blocks;
  if (shell?.lang !== "sh" || app?.lang !== "ts" || run?.lang !== "sh")
    throw new Error(`the walkthrough's blocks changed: ${blocks.map((b) => b.lang).join(", ")}`);
  return { shell: shell.text, app: app.text, run: run.text };
}

let server: ServerProcess | undefined;
afterAll(async () => {
  await server?.stop();
  removeTempDirs();
});

/** Runs `script` in bash, strictly by default; `pasted` runs on after a failing line, as a terminal does. */
async function sh(
  script: string,
  cwd: string,
  mode: "strict" | "pasted" = "strict",
): Promise<{ code: number; stdout: string; stderr: string }> {
  const flags = mode === "strict" ? ["-euo", "pipefail"] : [];
  const proc = Bun.spawn(["bash", ...flags, "-c", script], {
    cwd,
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? cwd },
    stdout: "pipe",
    stderr: "pipe",
  });
  const [stdout, stderr] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
  ]);
  return { code: await proc.exited, stdout, stderr };
}

test(
  "the README's walkthrough takes a fresh server from its test key to an activated device, as written",
  async () => {
    const { shell, app, run } = walkthroughBlocks();
    const dataDir = join(tempDir("licensing-readme-"), "data");
    server = await startServe(["--data-dir", dataDir]);
    const testKey = /test: (lsk_test_\S+)/.exec(server.stdout())?.[1];
    expect(testKey).toBeDefined();
    // The app imports ./src/sdk and runs with npx bun from beside the repository, as the README says.
    const appDir = tempDir("licensing-readme-app-");
    symlinkSync(join(ROOT, "src"), join(appDir, "src"));
    symlinkSync(join(ROOT, "node_modules"), join(appDir, "node_modules"));
    writeFileSync(join(appDir, "try-app.ts"), app);

    const setUp = shell
      .replace(/^KEY=lsk_test_\.\.\..*$/m, `KEY=${testKey}`)
      .replace(/^B=http:\/\/127\.0\.0\.1:8080$/m, `B=${server.url}`);
    expect(setUp).not.toBe(shell);
    const script = `${setUp}\n${run}\n${run.trim()} && echo SECOND_RUN_ACTIVATED || echo SECOND_RUN_REFUSED`;
    const result = await sh(script, appDir);
    expect({ code: result.code, stderr: result.code === 0 ? "" : result.stderr }).toEqual({
      code: 0,
      stderr: "",
    });
    // The first run prints the state and the activation, as the app's comment says.
    expect(result.stdout).toMatch(/^valid act_[0-9A-Z]{26}$/m);
    // The second is refused: the default policy allows one machine.
    expect(result.stdout).toContain("SECOND_RUN_REFUSED");
    expect(result.stdout + result.stderr).toContain("MACHINE_LIMIT_REACHED");
    const configText = readFileSync(join(appDir, "service.config.json"), "utf8");
    expect(JSON.parse(configText)).toMatchObject({ environment: "test", api_url: server.url });

    // The block pasted again on the same data, as the README warns: the product code is taken.
    // Each failing step prints the service's error, not a stack trace, and the working config is
    // left as it was rather than emptied.
    const again = await sh(setUp, appDir, "pasted");
    expect(again.code).not.toBe(0);
    expect(again.stderr).toContain("VALIDATION_FAILED: Some values are invalid.");
    expect(again.stderr).toContain("is already used by another product");
    expect(again.stderr).not.toMatch(/TypeError|SyntaxError|^\s+at /m);
    expect(readFileSync(join(appDir, "service.config.json"), "utf8")).toBe(configText);
  },
  BUILD_TIMEOUT_MS,
);
