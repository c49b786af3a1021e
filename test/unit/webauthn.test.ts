import { expect, test } from "bun:test";
import { decodeCbor, parseAuthenticatorData, WebAuthnError } from "../../src/crypto/webauthn.ts";
import { cbor } from "../support/passkey.ts";

test("CBOR round-trips what authenticators send: ints, negative ints, text, bytes, arrays, maps", () => {
  const value = new Map<unknown, unknown>([
    [1, 2],
    [-1, 6],
    ["fmt", "none"],
    ["list", [0, 23, 24, 255, 256, 65_535, 65_536]],
    [-2, new Uint8Array([1, 2, 3])],
  ]);
  // biome-ignore lint/suspicious/noExplicitAny: the encoder takes its own recursive type.
  const decoded = decodeCbor(cbor(value as any));
  expect(decoded.value).toEqual(value as never);
});

test("CBOR that is truncated, indefinite, tagged or nested too deeply is refused", () => {
  const refused = (bytes: number[]) => expect(() => decodeCbor(new Uint8Array(bytes))).toThrow(WebAuthnError);
  refused([]);
  refused([0x59, 0x01]); // byte string with a truncated length
  refused([0x43, 1, 2]); // 3 bytes announced, 2 present
  refused([0x5f, 0xff]); // indefinite-length byte string
  refused([0xc1, 0x00]); // tag 1
  refused([0x1f]); // reserved additional information
  refused(Array(40).fill(0x81)); // arrays nested 40 deep
  refused([0xf7]); // undefined
});

test("authenticator data shorter than its fixed part or with a broken credential is refused", () => {
  expect(() => parseAuthenticatorData(new Uint8Array(36))).toThrow(WebAuthnError);
  const attested = new Uint8Array(60);
  attested[32] = 0x41;
  attested[53] = 0xff; // a credential id longer than the data
  expect(() => parseAuthenticatorData(attested)).toThrow(WebAuthnError);
});
