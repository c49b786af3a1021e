import { expect, test } from "bun:test";
import { generateKeyPairSync } from "node:crypto";
import {
  coseToJwk,
  decodeCbor,
  parseAuthenticatorData,
  verifyAssertion,
  WebAuthnError,
} from "../../src/crypto/webauthn.ts";
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
  refused([0x62, 0xc3, 0x28]); // text that is not UTF-8
  refused([0xa1, 0x62, 0xc3, 0x28, 0x01]); // ... as a map key
});

test("a P-256 COSE key off the curve is refused; one on it is taken", () => {
  const p256 = (x: Uint8Array, y: Uint8Array) =>
    new Map<unknown, unknown>([
      [1, 2],
      [3, -7],
      [-1, 1],
      [-2, x],
      [-3, y],
    ]) as Parameters<typeof coseToJwk>[0];
  expect(() => coseToJwk(p256(new Uint8Array(32).fill(1), new Uint8Array(32).fill(2)))).toThrow(
    WebAuthnError,
  );
  expect(() => coseToJwk(p256(new Uint8Array(32), new Uint8Array(32)))).toThrow(WebAuthnError);
  const jwk = generateKeyPairSync("ec", { namedCurve: "P-256" }).publicKey.export({ format: "jwk" });
  const on = p256(Buffer.from(jwk.x as string, "base64url"), Buffer.from(jwk.y as string, "base64url"));
  expect(coseToJwk(on).jwk).toMatchObject({ kty: "EC", crv: "P-256", x: jwk.x, y: jwk.y });
});

test("an assertion by a stored key that is not a usable key (stored before points were checked) is refused, not thrown past", () => {
  const offCurve = {
    alg: -7 as const,
    jwk: {
      kty: "EC",
      crv: "P-256",
      x: Buffer.alloc(32, 1).toString("base64url"),
      y: Buffer.alloc(32, 2).toString("base64url"),
    },
  };
  const rp = { id: "licensing.test", origin: "http://licensing.test" };
  const clientDataJson = Buffer.from(
    JSON.stringify({ type: "webauthn.get", challenge: "c", origin: rp.origin }),
  );
  const authenticatorData = Buffer.concat([
    new Bun.CryptoHasher("sha256").update(rp.id).digest(),
    Buffer.from([0x05, 0, 0, 0, 1]),
  ]);
  expect(() =>
    verifyAssertion({
      key: offCurve,
      storedSignCount: 0,
      clientDataJson,
      authenticatorData,
      signature: new Uint8Array(70),
      challenge: "c",
      rp,
    }),
  ).toThrow("the stored passkey's public key is not usable");
});

test("authenticator data shorter than its fixed part or with a broken credential is refused", () => {
  expect(() => parseAuthenticatorData(new Uint8Array(36))).toThrow(WebAuthnError);
  const attested = new Uint8Array(60);
  attested[32] = 0x41;
  attested[53] = 0xff; // a credential id longer than the data
  expect(() => parseAuthenticatorData(attested)).toThrow(WebAuthnError);
});
