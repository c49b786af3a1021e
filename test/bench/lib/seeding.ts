import { readFileSync } from "node:fs";
import { join } from "node:path";
import { type BenchDevice, SeedSigner } from "./requests.ts";

/**
 * Seeds `rows` activations into a stopped server's store with seed.ts (the bench's scale run) and
 * returns seed.ts's figures and the devices of the `sample` rows whose signing seeds it kept.
 * `command` wraps the command line (run.ts pins it to its CPUs).
 */
export function seedActivations(options: {
  store: string;
  productId: string;
  rows: number;
  sample: number;
  sampleFile: string;
  command?: (args: string[]) => string[];
}): { stats: Record<string, number>; devices: BenchDevice[] } {
  const args = [
    process.execPath,
    join(import.meta.dir, "..", "seed.ts"),
    options.store,
    options.productId,
    String(options.rows),
    String(options.sample),
    options.sampleFile,
  ];
  const seeded = Bun.spawnSync(options.command ? options.command(args) : args, {
    stdout: "pipe",
    stderr: "pipe",
  });
  if (seeded.exitCode !== 0) throw new Error(`seeding failed: ${seeded.stderr.toString()}`);
  const devices = readFileSync(options.sampleFile, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      const [activationId = "", seedText = ""] = line.split(" ");
      return { activationId, signer: new SeedSigner(Buffer.from(seedText, "base64url")) };
    });
  return { stats: JSON.parse(seeded.stdout.toString().trim()) as Record<string, number>, devices };
}
