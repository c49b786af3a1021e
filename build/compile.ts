import { existsSync, mkdirSync, readdirSync, renameSync, rmSync, statSync } from "node:fs";
import { dirname, join } from "node:path";

/**
 * `npm run build`: compiles src/main.ts into one self-contained executable, build/out/licensing.
 * Migrations (a macro) and docs/swagger assets (text imports) are inlined by the bundler, so the
 * binary needs nothing from the source tree at run time.
 */
const ROOT = join(import.meta.dir, "..");
export const EXECUTABLE = join(ROOT, "build/out/licensing");

/** Everything that ends up inside the binary; a newer file here means the binary is stale. */
const INPUTS = ["src", "db/migrations", "docs", "package.json", "package-lock.json", "build/compile.ts"];

const FLAGS = [
  "--compile",
  "--minify",
  "--bytecode",
  "--format=esm",
  // A compiled binary would otherwise read .env and bunfig.toml from whatever directory it runs in.
  "--no-compile-autoload-dotenv",
  "--no-compile-autoload-bunfig",
];

function newestMtime(path: string): number {
  if (!existsSync(path)) return 0;
  const stat = statSync(path);
  if (!stat.isDirectory()) return stat.mtimeMs;
  let newest = stat.mtimeMs;
  for (const entry of readdirSync(path)) newest = Math.max(newest, newestMtime(join(path, entry)));
  return newest;
}

export function isExecutableStale(): boolean {
  if (!existsSync(EXECUTABLE)) return true;
  const built = statSync(EXECUTABLE).mtimeMs;
  return INPUTS.some((input) => newestMtime(join(ROOT, input)) > built);
}

/**
 * Builds to a temporary name and renames, so a concurrent reader (another test file, a smoke test)
 * never runs a half-written executable. `process.execPath` is the Bun running this script.
 */
export function buildExecutable(): void {
  mkdirSync(dirname(EXECUTABLE), { recursive: true });
  const temp = `${EXECUTABLE}.tmp-${process.pid}`;
  const result = Bun.spawnSync(
    [process.execPath, "build", join(ROOT, "src/main.ts"), ...FLAGS, `--outfile=${temp}`],
    { cwd: ROOT, stdout: "pipe", stderr: "pipe" },
  );
  if (result.exitCode !== 0) {
    rmSync(temp, { force: true });
    throw new Error(
      `bun build failed (exit ${result.exitCode}):\n${result.stdout.toString()}${result.stderr.toString()}`,
    );
  }
  renameSync(temp, EXECUTABLE);
}

/** Builds only when a source is newer than the executable; for the end-to-end tests. */
export function ensureExecutable(): string {
  if (isExecutableStale()) buildExecutable();
  return EXECUTABLE;
}

if (import.meta.main) {
  const started = performance.now();
  buildExecutable();
  const size = statSync(EXECUTABLE).size / 1024 / 1024;
  console.log(
    `built ${EXECUTABLE} (${size.toFixed(1)} MiB) in ${((performance.now() - started) / 1000).toFixed(1)} s`,
  );
}
