/**
 * Issue 5's memory check: sealing a large file must stream, so peak memory stays flat however big
 * the file is. Run with `bun test/bench/seal-memory.ts [size in MiB, default 2048]`; it prints the
 * peak resident set size of this process before and after sealing and PASS when sealing added
 * less than 256 MiB. Kept out of `npm test`: it writes and reads gigabytes.
 */
import { generateKeyPairSync } from "node:crypto";
import { closeSync, mkdtempSync, openSync, readFileSync, rmSync, statSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { keyIdOf, publicKeyText } from "../../src/crypto/keys.ts";
import { parseSealingKeyLine, sealFile, sealingKeyLine } from "../../src/crypto/sealed-file.ts";

const MIB = 1024 * 1024;
const sizeMib = Number(process.argv[2] ?? 2048);
const budgetMib = 256;

/** Peak resident set size of this process so far (VmHWM), in MiB. */
const peakRssMib = () =>
  Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"))?.[1] ?? 0) / 1024;

const dir = mkdtempSync(join(tmpdir(), "licensing-seal-bench-"));
try {
  const input = join(dir, "input.bin");
  const fd = openSync(input, "w");
  const block = new Uint8Array(MIB).map((_, i) => i & 0xff);
  for (let i = 0; i < sizeMib; i++) writeSync(fd, block);
  closeSync(fd);

  const { publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const text = publicKeyText(publicKey);
  const point = new Uint8Array(Buffer.from(text.slice("p256:".length), "base64url"));
  const key = parseSealingKeyLine(sealingKeyLine("prod_01BENCHBENCHBENCHBENCHBENC", keyIdOf(text), point));

  const before = peakRssMib();
  const started = performance.now();
  await sealFile(input, join(dir, "output.sealed"), key);
  const seconds = (performance.now() - started) / 1000;
  const after = peakRssMib();
  const grew = after - before;
  console.log(`sealed ${sizeMib} MiB in ${seconds.toFixed(1)} s (${(sizeMib / seconds).toFixed(0)} MiB/s)`);
  console.log(`output ${(statSync(join(dir, "output.sealed")).size / MIB).toFixed(1)} MiB`);
  console.log(
    `peak RSS before ${before.toFixed(0)} MiB, after ${after.toFixed(0)} MiB (grew ${grew.toFixed(0)} MiB)`,
  );
  console.log(
    `${grew < budgetMib ? "PASS" : "FAIL"}: sealing grew peak memory by less than ${budgetMib} MiB`,
  );
  process.exitCode = grew < budgetMib ? 0 : 1;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
