import { afterAll, afterEach, describe, expect, spyOn, test } from "bun:test";
import { createHash, randomBytes } from "node:crypto";
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DESCRIBE_CHUNK_BYTES, describeFile } from "../../src/store/backup.ts";

/**
 * describeFile checksums the store for the backup manifest and for restore's check. A store can be
 * many GiB: it is hashed through one buffer of a fixed size, never read whole into memory.
 */
const work = fs.mkdtempSync(join(tmpdir(), "describe-file-"));
afterAll(() => fs.rmSync(work, { recursive: true, force: true }));
afterEach(() => {
  // spyOn replaces a function on node:fs itself: put every one back.
  for (const fn of [fs.readSync, fs.readFileSync] as unknown as { mockRestore?: () => void }[]) {
    fn.mockRestore?.();
  }
});

const whole = (bytes: Buffer) => ({
  sha256: createHash("sha256").update(bytes).digest("hex"),
  bytes: bytes.length,
});

function fileOf(name: string, bytes: Buffer): string {
  const path = join(work, name);
  fs.writeFileSync(path, bytes);
  return path;
}

describe("describeFile", () => {
  test("gives the sha256 and size of the whole file for files shorter than, equal to and longer than a chunk", () => {
    const chunk = 64;
    for (const size of [0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk, 10 * chunk + 17]) {
      const bytes = randomBytes(size);
      expect(describeFile(fileOf(`size-${size}`, bytes), chunk)).toEqual(whole(bytes));
    }
  });

  test("reads a file larger than its chunk in chunk-sized pieces, never the whole file at once", () => {
    const chunk = 1000;
    const bytes = randomBytes(25 * chunk + 3);
    const path = fileOf("pieces", bytes);
    const readFile = spyOn(fs, "readFileSync");
    const read = spyOn(fs, "readSync");
    expect(describeFile(path, chunk)).toEqual(whole(bytes));
    expect(readFile).not.toHaveBeenCalled();
    // 26 reads with data and the one that finds the end.
    expect(read).toHaveBeenCalledTimes(27);
    // readSync(fd, buffer, offset, length, position): no read asks for more than a chunk.
    for (const call of read.mock.calls as unknown as [number, Buffer, number, number][]) {
      expect(call[3]).toBeLessThanOrEqual(chunk);
    }
  });

  test("uses a chunk of 1 MiB by default and gives the same answer as with a small one", () => {
    expect(DESCRIBE_CHUNK_BYTES).toBe(1024 * 1024);
    const bytes = randomBytes(DESCRIBE_CHUNK_BYTES + 12_345);
    const path = fileOf("default", bytes);
    expect(describeFile(path)).toEqual(whole(bytes));
    expect(describeFile(path, 4096)).toEqual(whole(bytes));
  });
});
