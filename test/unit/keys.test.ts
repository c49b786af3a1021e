import { expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import { parsePublicKey, publicKeyText, verifySignature } from "../../src/crypto/keys.ts";

const b64u = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64url");

test("a small-order Ed25519 key is refused, so a forged all-zero signature can never verify for it", () => {
  const identity = new Uint8Array(32);
  identity[0] = 1;
  expect(parsePublicKey(`ed25519:${b64u(identity)}`)).toBeNull();
  // Another small-order point: the encoding of order-2 point (0, -1).
  const orderTwo = new Uint8Array(32).fill(0xff);
  orderTwo[0] = 0xec;
  orderTwo[31] = 0x7f;
  expect(parsePublicKey(`ed25519:${b64u(orderTwo)}`)).toBeNull();
});

test("a proper Ed25519 key parses and verifies its own signature only", () => {
  const { publicKey } = generateKeyPairSync("ed25519");
  const info = parsePublicKey(publicKeyText(publicKey));
  expect(info?.alg).toBe("ed25519");
  const forged = new Uint8Array(64);
  forged[0] = 1;
  expect(verifySignature(info as NonNullable<typeof info>, "any message", b64u(forged))).toBe(false);
});

test("malformed key strings are refused: bad prefix, bad length, non-canonical base64url, off-curve P-256", () => {
  const { publicKey } = generateKeyPairSync("ec", { namedCurve: "P-256" });
  const p256 = publicKeyText(publicKey);
  expect(parsePublicKey(p256)?.alg).toBe("p256");
  const point = Buffer.from(p256.slice(5), "base64url");
  point[64] = (point[64] as number) ^ 1;
  expect(parsePublicKey(`p256:${b64u(point)}`)).toBeNull();
  expect(parsePublicKey("rsa:AAAA")).toBeNull();
  expect(parsePublicKey(`ed25519:${b64u(new Uint8Array(31))}`)).toBeNull();
  expect(parsePublicKey(`${p256}=`)).toBeNull();
});
