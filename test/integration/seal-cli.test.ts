import { afterAll, describe, expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import {
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { b64u } from "../../src/crypto/encoding.ts";
import { keyIdOf, publicKeyText } from "../../src/crypto/keys.ts";
import { sealingKeyLine } from "../../src/crypto/sealed-file.ts";
import { runInProcess } from "../support/in-process-cli.ts";
import { makeSpecialFiles, stillSpecial } from "../support/special-files.ts";

/**
 * How `licensing seal` puts its output in place: a temp file beside it, renamed when whole. Some
 * tests run the real entry point in child processes, since what matters there is several runs at
 * once (and, in containers, every run may be PID 1).
 */
const work = mkdtempSync(join(tmpdir(), "seal-cli-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const publicText = publicKeyText(generateKeyPairSync("ec", { namedCurve: "P-256" }).publicKey);
const LINE = sealingKeyLine(
  "prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y",
  keyIdOf(publicText),
  b64u.decode(publicText.slice("p256:".length)),
);
const MAIN = join(import.meta.dir, "../../src/main.ts");
/** For the tests that start processes: Bun's start-up, and a wait of up to 10 s for their files. */
const PROCESS_TIMEOUT_MS = 20_000;

/** A fresh directory in the work dir, holding `plain.bin`. */
function folder(name: string): string {
  const dir = join(work, name);
  mkdirSync(dir);
  writeFileSync(join(dir, "plain.bin"), "some plaintext");
  return dir;
}

const seal = (dir: string, input: string, output: string, ...more: string[]) =>
  runInProcess(["seal", "--sealing-key", LINE, ...more, input, output], dir);

/** The file id in a sealed file's header. */
const fileIdOf = (path: string) => /"file_id":"([^"]+)"/.exec(readFileSync(path, "latin1"))?.[1];

describe("where licensing seal writes", () => {
  test("a 250-character output name is written", async () => {
    const dir = folder("long");
    const name = `${"s".repeat(243)}.sealed`;
    const run = await seal(dir, "plain.bin", name);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(readdirSync(dir).sort()).toEqual([name, "plain.bin"].sort());
  });

  test("an output it cannot write is named as given, never by a temp file", async () => {
    const dir = folder("unwritable");
    mkdirSync(join(dir, "a-directory"));
    const outs = [
      ["no-such-dir/out.sealed", "its directory does not exist"],
      ["a-directory", "it is a directory"],
      [`${"s".repeat(256)}.sealed`, "its name is too long"],
    ];
    for (const [out, reason] of outs) {
      const run = await seal(dir, "plain.bin", out ?? "");
      expect(run).toEqual({
        code: 1,
        stdout: "",
        stderr: `licensing seal: cannot write ${out}: ${reason}\n`,
      });
    }
    expect(readdirSync(dir).sort()).toEqual(["a-directory", "plain.bin"]);
    expect(readdirSync(join(dir, "a-directory"))).toEqual([]);
  });

  test("an output that is a FIFO, a socket or a device node, or a link to one, is refused and stays as it was; a link to a regular file or to nothing is replaced itself", async () => {
    const dir = folder("special");
    const special = await makeSpecialFiles(dir, ".sealed");
    // The command's own stdout, as /dev/stdout leads to it: a pipe, by /proc/self/fd.
    const pipeFd = openSync(join(dir, special.files[0]?.name ?? ""), "r+");
    symlinkSync(`/proc/self/fd/${pipeFd}`, join(dir, "stdout.sealed"));
    try {
      const refusals = [
        ...special.files.map(({ name, kind }) => ({ name, reason: `it is ${kind}, not a regular file` })),
        ...special.files.map(({ name, kind }) => {
          symlinkSync(join(dir, name), join(dir, `link-to-${name}`));
          return {
            name: `link-to-${name}`,
            reason: `it is a symbolic link to ${kind}, not to a regular file`,
          };
        }),
        { name: "stdout.sealed", reason: "it is a symbolic link to a FIFO, not to a regular file" },
      ];
      for (const { name, reason } of refusals) {
        const run = await seal(dir, "plain.bin", name);
        expect({ name, ...run }).toEqual({
          name,
          code: 1,
          stdout: "",
          stderr: `licensing seal: cannot write ${name}: ${reason}\n`,
        });
      }
      for (const { name } of special.files) expect(stillSpecial(join(dir, name))).toBe(true);
      for (const { name } of refusals.slice(special.files.length))
        expect(lstatSync(join(dir, name)).isSymbolicLink()).toBe(true);
      expect(readdirSync(dir).sort()).toEqual(
        ["plain.bin", ...refusals.map((refused) => refused.name)].sort(),
      );

      // A link to a file, or a dangling one, is an ordinary destination: the rename replaces the
      // link, never what it leads to.
      writeFileSync(join(dir, "older.sealed"), "an older file");
      symlinkSync(join(dir, "older.sealed"), join(dir, "file-link.sealed"));
      symlinkSync(join(dir, "nowhere.sealed"), join(dir, "dangling.sealed"));
      for (const name of ["file-link.sealed", "dangling.sealed"]) {
        const linked = await seal(dir, "plain.bin", name);
        expect([name, linked.code, linked.stderr]).toEqual([name, 0, ""]);
        expect(lstatSync(join(dir, name)).isFile()).toBe(true);
        expect(fileIdOf(join(dir, name))).toBeDefined();
      }
      expect(readFileSync(join(dir, "older.sealed"), "utf8")).toBe("an older file");
      expect(existsSync(join(dir, "nowhere.sealed"))).toBe(false);
    } finally {
      closeSync(pipeFd);
      await special.close();
    }
  });

  test("an output in /proc or /sys, by its path or through a link to a directory there, is refused before anything is written", async () => {
    const dir = folder("system");
    // /dev is where it matters (as root, /dev/stdout is a link the rename would replace), but a
    // test must not risk a file there: /proc and /sys take the same check, and refuse writes anyway.
    symlinkSync("/proc/self", join(dir, "proc-link"));
    const outs = [
      ["/proc/self/out.sealed", "/proc, the kernel's process interface"],
      ["/sys/out.sealed", "/sys, the kernel's device interface"],
      ["proc-link/out.sealed", "/proc, the kernel's process interface"],
    ];
    for (const [out, where] of outs) {
      const run = await seal(dir, "plain.bin", out ?? "");
      expect(run).toEqual({
        code: 1,
        stdout: "",
        stderr: `licensing seal: cannot write ${out}: it is in ${where}, not a place for files\n`,
      });
    }
    expect(readdirSync(dir).sort()).toEqual(["plain.bin", "proc-link"]);
  });

  test("/dev/shm, an ordinary tmpfs inside /dev that containers write scratch files to, takes an output", async () => {
    const dir = folder("shm");
    const scratch = mkdtempSync("/dev/shm/licensing-seal-test-");
    try {
      const out = join(scratch, "out.sealed");
      const run = await seal(dir, "plain.bin", out);
      expect(run.code).toBe(0);
      expect(fileIdOf(out)).toEqual(expect.any(String));
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
  });

  test("an output named with a trailing slash is refused, and neither a file nor a directory of that name is made", async () => {
    const dir = folder("trailing");
    mkdirSync(join(dir, "existing"));
    for (const out of ["newdir/", "existing/"]) {
      const run = await seal(dir, "plain.bin", out);
      expect(run).toEqual({
        code: 1,
        stdout: "",
        stderr: `licensing seal: cannot write ${out}: a file is needed, and a name ending in "/" is a directory's\n`,
      });
    }
    expect(readdirSync(dir).sort()).toEqual(["existing", "plain.bin"]);
    expect(readdirSync(join(dir, "existing"))).toEqual([]);
  });

  test("a file beside the output named like another run's temp file is neither in the way nor removed", async () => {
    const dir = folder("stale");
    // The name an earlier version gave its temp file, with this process's PID: another run's
    // file, or one left by a run that was killed, is not this run's to remove.
    const other = `out.sealed.tmp-${process.pid}`;
    writeFileSync(join(dir, other), "another run's partial output");
    const run = await seal(dir, "plain.bin", "out.sealed");
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(readFileSync(join(dir, other), "utf8")).toBe("another run's partial output");
    expect(readdirSync(dir).sort()).toEqual([other, "out.sealed", "plain.bin"].sort());
  });

  test.each([
    ["SIGINT", 130],
    ["SIGTERM", 143],
    // A closed terminal or a dropped SSH session; Ctrl-\ (SIGQUIT).
    ["SIGHUP", 129],
    ["SIGQUIT", 131],
  ] as const)(
    "a seal interrupted by %s leaves no temp file and exits %d",
    async (signal, status) => {
      const dir = folder(signal);
      const fifo = join(dir, "slow.fifo");
      expect(Bun.spawnSync(["mkfifo", fifo]).exitCode).toBe(0);
      const writer = openSync(fifo, "r+");
      const child = Bun.spawn(
        [process.execPath, MAIN, "seal", "--sealing-key", LINE, "slow.fifo", "out.sealed"],
        {
          cwd: dir,
          stdout: "pipe",
          stderr: "pipe",
          env: { PATH: Bun.env.PATH },
        },
      );
      try {
        // Chunks written, and more to come: the partial output is on disk beside out.sealed.
        writeSync(writer, new Uint8Array(200_000));
        const partial = () => readdirSync(dir).filter((name) => !["plain.bin", "slow.fifo"].includes(name));
        const deadline = Date.now() + 10_000;
        while (Date.now() < deadline) {
          const [temp] = partial();
          if (temp !== undefined && statSync(join(dir, temp)).size > 65_536) break;
          await Bun.sleep(20);
        }
        expect(partial()).toHaveLength(1);
        child.kill(signal);
        await child.exited;
      } finally {
        closeSync(writer);
      }
      expect(readdirSync(dir).sort()).toEqual(["plain.bin", "slow.fifo"]);
      expect([child.exitCode, child.signalCode]).toEqual([status, null]);
    },
    PROCESS_TIMEOUT_MS,
  );

  // unshare -p -f starts each run as PID 1 of its own PID namespace, as a container does.
  const canUnshare =
    Bun.spawnSync(["unshare", "-p", "-f", "true"], { stdout: "ignore", stderr: "ignore" }).exitCode === 0;

  test.skipIf(!canUnshare)(
    "two seals to one output, both in progress, do not remove each other's temp file",
    async () => {
      const dir = folder("together");
      const fifo = join(dir, "slow.fifo");
      expect(Bun.spawnSync(["mkfifo", fifo]).exitCode).toBe(0);
      // Read-write: opening never waits for the other end, and the first run's input stays open
      // (no end of file) until this test closes it.
      const writer = openSync(fifo, "r+");
      const sealAsPid1 = (input: string) =>
        Bun.spawn(
          [
            "unshare",
            "-p",
            "-f",
            process.execPath,
            MAIN,
            "seal",
            "--sealing-key",
            LINE,
            "--json",
            input,
            "out.sealed",
          ],
          { cwd: dir, stdout: "pipe", stderr: "pipe", env: { PATH: Bun.env.PATH } },
        );
      const finished = async (child: ReturnType<typeof sealAsPid1>) => ({
        code: await child.exited,
        stdout: await new Response(child.stdout).text(),
        stderr: await new Response(child.stderr).text(),
      });
      const first = sealAsPid1("slow.fifo");
      let second: Awaited<ReturnType<typeof finished>>;
      try {
        // The first run is in progress once its temp file is there.
        const deadline = Date.now() + 10_000;
        while (readdirSync(dir).length < 3 && Date.now() < deadline) await Bun.sleep(20);
        expect(readdirSync(dir)).toHaveLength(3);
        second = await finished(sealAsPid1("plain.bin"));
        writeSync(writer, "the first run's plaintext");
      } finally {
        closeSync(writer);
      }
      const firstRun = await finished(first);
      expect([second.code, second.stderr]).toEqual([0, ""]);
      expect([firstRun.code, firstRun.stderr]).toEqual([0, ""]);
      // Both wrote whole files; the one that finished last is in place, and no temp file is left.
      expect(fileIdOf(join(dir, "out.sealed"))).toBe(JSON.parse(firstRun.stdout).file_id);
      expect(readdirSync(dir).sort()).toEqual(["out.sealed", "plain.bin", "slow.fifo"]);
    },
    PROCESS_TIMEOUT_MS,
  );
});

describe("what licensing seal says", () => {
  test("an input that is a directory is refused in words, naming it, and nothing is written", async () => {
    const dir = folder("input-dir");
    mkdirSync(join(dir, "assets"));
    expect(await seal(dir, "assets", "out.sealed")).toEqual({
      code: 1,
      stdout: "",
      stderr: "licensing seal: cannot read assets: it is a directory\n",
    });
    expect(readdirSync(dir).sort()).toEqual(["assets", "plain.bin"]);
  });

  test("a sealing key whose point is not on P-256 is a usage error, even with a key id made to match", async () => {
    const dir = folder("off-curve");
    // x = 0, y = 1: 65 bytes with the uncompressed prefix, and no point of the curve.
    const point = new Uint8Array(65);
    point[0] = 4;
    point[64] = 1;
    const encoded = b64u.encode(point);
    const line = `service-sealing-key-v1:prod_01JZ8X4M6Q2T9V3B7N5K1R0W8Y:${keyIdOf(`p256:${encoded}`)}:${encoded}`;
    expect(await runInProcess(["seal", "--sealing-key", line, "plain.bin", "out.sealed"], dir)).toEqual({
      code: 2,
      stdout: "",
      stderr:
        "licensing seal: --sealing-key: the public key is not a point on P-256\n" +
        'Run "licensing seal --help" for its options.\n',
    });
    expect(readdirSync(dir)).toEqual(["plain.bin"]);
  });

  test("the public_key pasted as --sealing-key is refused with where the sealing_key line is, and nothing is written", async () => {
    const dir = folder("public-key");
    expect(await runInProcess(["seal", "--sealing-key", publicText, "plain.bin", "out.sealed"], dir)).toEqual(
      {
        code: 2,
        stdout: "",
        stderr:
          'licensing seal: --sealing-key: a sealing key starts with "service-sealing-key-v1:"; ' +
          "that is the key's public_key: give its sealing_key line instead, current_key.sealing_key of the " +
          "product's sealed-files status (GET /mgmt/v1/products/{id}/sealed-files), or the line licensing sealing-keys list prints\n" +
          'Run "licensing seal --help" for its options.\n',
      },
    );
    expect(readdirSync(dir)).toEqual(["plain.bin"]);
  });

  test("any other value that is no sealing-key line is told where the line is; a damaged line is not", async () => {
    const dir = folder("not-a-line");
    for (const given of ["k_1234", "  ", "pasted from the wrong field"]) {
      const result = await runInProcess(["seal", "--sealing-key", given, "plain.bin", "out.sealed"], dir);
      expect([result.code, result.stderr.split("\n")[0]]).toEqual([
        2,
        'licensing seal: --sealing-key: a sealing key starts with "service-sealing-key-v1:"; give ' +
          "current_key.sealing_key of the product's sealed-files status (GET /mgmt/v1/products/{id}/sealed-files), " +
          "or the line licensing sealing-keys list prints",
      ]);
    }
    const damaged = await runInProcess(
      ["seal", "--sealing-key", LINE.slice(0, -4), "plain.bin", "out.sealed"],
      dir,
    );
    expect([damaged.code, damaged.stderr.split("\n")[0]]).toEqual([
      2,
      "licensing seal: --sealing-key: the sealing key's public key is not a 65-byte P-256 point",
    ]);
    expect(readdirSync(dir)).toEqual(["plain.bin"]);
  });

  test(
    "a report stdout cannot take (a full disk) fails with one line and exit 1, not a silent 0",
    () => {
      const dir = folder("full");
      const full = openSync("/dev/full", "w");
      try {
        const run = Bun.spawnSync(
          [process.execPath, MAIN, "seal", "--sealing-key", LINE, "--json", "plain.bin", "out.sealed"],
          { cwd: dir, stdout: full, stderr: "pipe", env: { PATH: Bun.env.PATH } },
        );
        expect([run.exitCode, run.stderr.toString()]).toEqual([
          1,
          "licensing seal: cannot print to stdout: no space left on device\n",
        ]);
      } finally {
        closeSync(full);
      }
    },
    PROCESS_TIMEOUT_MS,
  );
});
