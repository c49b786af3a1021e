import { captureStdout } from "../../src/cli/console.ts";
import type { Env } from "../../src/config.ts";
import { main } from "../../src/main.ts";

/**
 * Runs the command line in this process (`main`, as the executable does) and captures what it
 * prints: for tests that need the command and an in-process server on one store, or a command's
 * output without spawning a process. `env` is the environment the command sees (none by default).
 */
export async function runInProcess(
  args: string[],
  cwd: string,
  env: Env = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = "";
  let stderr = "";
  const err = process.stderr.write.bind(process.stderr);
  const release = captureStdout((text) => {
    stdout += text;
  });
  process.stderr.write = ((chunk: string) => {
    stderr += chunk;
    return true;
  }) as typeof process.stderr.write;
  try {
    return { code: await main(args, env, cwd), stdout, stderr };
  } finally {
    release();
    process.stderr.write = err;
  }
}
