/**
 * A strict reader for the ZIP files the service writes (offline packages): stored entries only,
 * version 2.0, the fixed 1980-01-01 00:00 timestamp, no extra fields, comments, attributes, data
 * descriptors or encryption, entries laid end to end and then the central directory. Anything else is refused rather than interpreted, so a package has one
 * reading. Browser-safe and dependency-free; the service needs no inflater because it stores.
 */

export class ZipFormatError extends Error {
  override name = "ZipFormatError";
}

const LOCAL = 0x04034b50;
const CENTRAL = 0x02014b50;
const END = 0x06054b50;
const END_SIZE = 22;
const CENTRAL_SIZE = 46;
const LOCAL_SIZE = 30;
const VERSION = 20;
/** 00:00:00 and 1980-01-01 in DOS form: the one timestamp the service writes. */
const DOS_TIME = 0;
const DOS_DATE = (0 << 9) | (1 << 5) | 1;

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** CRC-32 (ISO-HDLC), as ZIP uses it. */
export function crc32(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) crc = CRC_TABLE[(crc ^ byte) & 0xff]! ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

const fail = (message: string): never => {
  throw new ZipFormatError(message);
};

/** The entries of `bytes` by name; the names must be exactly `expected`, in that order. */
export function readStoredZip(bytes: Uint8Array, expected: readonly string[]): Map<string, Uint8Array> {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const u16 = (at: number) => view.getUint16(at, true);
  const u32 = (at: number) => view.getUint32(at, true);
  if (bytes.length < END_SIZE) fail("too short to be a ZIP file");
  const end = bytes.length - END_SIZE;
  if (u32(end) !== END)
    fail("no end-of-central-directory record where it must be (a comment or trailing data?)");
  const count = u16(end + 10);
  const cdSize = u32(end + 12);
  const cdOffset = u32(end + 16);
  if (u16(end + 4) !== 0 || u16(end + 6) !== 0 || u16(end + 8) !== count || u16(end + 20) !== 0)
    fail("multi-disk archives and archive comments are not accepted");
  if (count !== expected.length) fail(`expected ${expected.length} entries, found ${count}`);
  if (cdOffset + cdSize !== end) fail("the central directory does not end where the end record begins");

  const nameOf = (from: number, length: number): string => {
    const raw = bytes.subarray(from, from + length);
    // Entry names are plain ASCII; anything else is not one of ours.
    if (raw.length !== length || length === 0 || raw.some((b) => b < 0x21 || b > 0x7e))
      fail("an entry name is not plain ASCII");
    return String.fromCharCode(...raw);
  };
  const entries = new Map<string, Uint8Array>();
  let cursor = cdOffset;
  let nextLocal = 0;
  for (let i = 0; i < count; i++) {
    if (cursor + CENTRAL_SIZE > end || u32(cursor) !== CENTRAL)
      fail("a central directory entry is malformed");
    // Version 2.0, no attributes and the fixed 1980-01-01 00:00 timestamp: with these pinned,
    // every byte of a package is either checked here or covered by a hash or a signature.
    if (
      u16(cursor + 4) !== VERSION ||
      u16(cursor + 6) !== VERSION ||
      u16(cursor + 36) !== 0 ||
      u32(cursor + 38) !== 0
    )
      fail("a central directory entry has another version or attributes");
    if (u16(cursor + 12) !== DOS_TIME || u16(cursor + 14) !== DOS_DATE)
      fail("an entry has another timestamp");
    const flags = u16(cursor + 8);
    const method = u16(cursor + 10);
    const crc = u32(cursor + 16);
    const size = u32(cursor + 20);
    const nameLength = u16(cursor + 28);
    const extraLength = u16(cursor + 30);
    const commentLength = u16(cursor + 32);
    const offset = u32(cursor + 42);
    if (flags !== 0 || method !== 0) fail("only plain stored entries are accepted");
    if (u32(cursor + 24) !== size) fail("a stored entry's sizes differ");
    if (extraLength !== 0 || commentLength !== 0 || u16(cursor + 34) !== 0)
      fail("extra fields are not accepted");
    const name = nameOf(cursor + CENTRAL_SIZE, nameLength);
    cursor += CENTRAL_SIZE + nameLength;

    // The entries lie end to end from the start of the file, in central-directory order.
    if (offset !== nextLocal) fail(`entry ${name} is not where the previous one ended`);
    if (offset + LOCAL_SIZE > cdOffset || u32(offset) !== LOCAL) fail(`entry ${name} has no local header`);
    if (
      u16(offset + 4) !== VERSION ||
      u16(offset + 6) !== flags ||
      u16(offset + 10) !== DOS_TIME ||
      u16(offset + 12) !== DOS_DATE ||
      u16(offset + 8) !== method ||
      u32(offset + 14) !== crc ||
      u32(offset + 18) !== size ||
      u32(offset + 22) !== size ||
      u16(offset + 26) !== nameLength ||
      u16(offset + 28) !== 0
    )
      fail(`entry ${name}: local header and central directory differ`);
    if (nameOf(offset + LOCAL_SIZE, nameLength) !== name)
      fail(`entry ${name}: local header names another file`);
    const start = offset + LOCAL_SIZE + nameLength;
    if (start + size > cdOffset) fail(`entry ${name} runs into the central directory`);
    const data = bytes.subarray(start, start + size);
    if (crc32(data) !== crc) fail(`entry ${name}: CRC-32 does not match`);
    // The names and their order are fixed (protocol §18): anything else was not made by the service.
    if (name !== expected[i]) {
      fail(
        expected.includes(name)
          ? `entry ${name} is out of place: entry ${i + 1} must be ${expected[i]}`
          : `unexpected entry ${name}`,
      );
    }
    entries.set(name, data);
    nextLocal = start + size;
  }
  if (nextLocal !== cdOffset) fail("data between the last entry and the central directory");
  if (cursor !== end) fail("data between the central directory and its end record");
  return entries;
}
