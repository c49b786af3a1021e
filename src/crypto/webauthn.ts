import { createHash, createPublicKey, type KeyObject, timingSafeEqual, verify } from "node:crypto";

/**
 * The parts of WebAuthn Level 2 a relying party needs for passkeys: a CBOR reader (RFC 8949,
 * definite lengths only, as CTAP2 canonical CBOR always is), authenticator data, COSE keys
 * (EdDSA/Ed25519 and ES256/P-256), registration (attestation format not verified: the
 * equivalent of attestation conveyance "none") and assertion checks.
 */

export type CborValue =
  | number
  | string
  | boolean
  | null
  | Uint8Array
  | CborValue[]
  | Map<CborValue, CborValue>;

export class WebAuthnError extends Error {}

const fail = (message: string): never => {
  throw new WebAuthnError(message);
};

/** Decodes one CBOR item at `offset`; returns it and the offset after it. */
export function decodeCbor(bytes: Uint8Array, offset = 0, depth = 0): { value: CborValue; end: number } {
  if (depth > 16) fail("CBOR nested too deeply");
  if (offset >= bytes.length) fail("CBOR truncated");
  const initial = bytes[offset] as number;
  const major = initial >> 5;
  const info = initial & 31;
  let pos = offset + 1;
  const need = (n: number) => {
    if (pos + n > bytes.length) fail("CBOR truncated");
  };
  let length: number;
  if (info < 24) length = info;
  else if (info >= 24 && info <= 27) {
    const size = 1 << (info - 24);
    need(size);
    length = 0;
    for (let i = 0; i < size; i++) length = length * 256 + (bytes[pos + i] as number);
    pos += size;
    if (!Number.isSafeInteger(length)) fail("CBOR integer too large");
  } else {
    return fail("CBOR indefinite lengths and reserved values are not accepted");
  }
  switch (major) {
    case 0:
      return { value: length, end: pos };
    case 1:
      return { value: -1 - length, end: pos };
    case 2:
      need(length);
      return { value: bytes.slice(pos, pos + length), end: pos + length };
    case 3: {
      need(length);
      let text = "";
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(bytes.subarray(pos, pos + length));
      } catch {
        fail("CBOR text is not UTF-8");
      }
      return { value: text, end: pos + length };
    }
    case 4: {
      if (length > 1024) fail("CBOR array too long");
      const items: CborValue[] = [];
      for (let i = 0; i < length; i++) {
        const item = decodeCbor(bytes, pos, depth + 1);
        items.push(item.value);
        pos = item.end;
      }
      return { value: items, end: pos };
    }
    case 5: {
      if (length > 1024) fail("CBOR map too long");
      const map = new Map<CborValue, CborValue>();
      for (let i = 0; i < length; i++) {
        const key = decodeCbor(bytes, pos, depth + 1);
        const value = decodeCbor(bytes, key.end, depth + 1);
        map.set(key.value, value.value);
        pos = value.end;
      }
      return { value: map, end: pos };
    }
    case 7:
      if (info === 20) return { value: false, end: pos };
      if (info === 21) return { value: true, end: pos };
      if (info === 22) return { value: null, end: pos };
      return fail("CBOR simple value not accepted");
    default:
      return fail("CBOR tags are not accepted");
  }
}

export interface AuthenticatorData {
  rpIdHash: Uint8Array;
  userPresent: boolean;
  userVerified: boolean;
  signCount: number;
  credential?: { id: Uint8Array; publicKey: Map<CborValue, CborValue> };
}

export function parseAuthenticatorData(bytes: Uint8Array): AuthenticatorData {
  if (bytes.length < 37) fail("authenticator data too short");
  const flags = bytes[32] as number;
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const data: AuthenticatorData = {
    rpIdHash: bytes.slice(0, 32),
    userPresent: (flags & 0x01) !== 0,
    userVerified: (flags & 0x04) !== 0,
    signCount: view.getUint32(33),
  };
  if (flags & 0x40) {
    if (bytes.length < 55) fail("attested credential data too short");
    const idLength = view.getUint16(53);
    if (idLength < 16 || idLength > 1023 || 55 + idLength > bytes.length) fail("bad credential id length");
    const id = bytes.slice(55, 55 + idLength);
    const key = decodeCbor(bytes, 55 + idLength);
    if (!(key.value instanceof Map)) fail("credential public key is not a COSE map");
    data.credential = { id, publicKey: key.value as Map<CborValue, CborValue> };
  }
  return data;
}

export interface StoredCredentialKey {
  alg: -7 | -8;
  jwk: Record<string, string>;
}

const b64u = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64url");

/** COSE_Key (RFC 9053) to a JWK: OKP Ed25519 with alg -8, EC2 P-256 with alg -7; nothing else. */
export function coseToJwk(cose: Map<CborValue, CborValue>): StoredCredentialKey {
  const kty = cose.get(1);
  const alg = cose.get(3);
  const crv = cose.get(-1);
  const x = cose.get(-2);
  if (kty === 1 && alg === -8 && crv === 6 && x instanceof Uint8Array && x.length === 32) {
    return { alg: -8, jwk: { kty: "OKP", crv: "Ed25519", x: b64u(x) } };
  }
  const y = cose.get(-3);
  if (
    kty === 2 &&
    alg === -7 &&
    crv === 1 &&
    x instanceof Uint8Array &&
    y instanceof Uint8Array &&
    x.length === 32 &&
    y.length === 32
  ) {
    const key: StoredCredentialKey = { alg: -7, jwk: { kty: "EC", crv: "P-256", x: b64u(x), y: b64u(y) } };
    // A point off the curve would be stored and then fail every sign-in: refused now instead.
    if (!keyFromJwk(key)) fail("the P-256 credential public key is not a point on the curve");
    return key;
  }
  return fail("only Ed25519 (-8) and P-256 (-7) passkeys are accepted");
}

/** The stored key as a KeyObject, or null when it is not a valid key (a point off the curve). */
export function keyFromJwk(key: StoredCredentialKey): KeyObject | null {
  try {
    return createPublicKey({ key: key.jwk, format: "jwk" });
  } catch {
    return null;
  }
}

export interface RelyingParty {
  id: string;
  origin: string;
}

const sha256 = (data: Uint8Array | string) => createHash("sha256").update(data).digest();

const equalBytes = (a: Uint8Array, b: Uint8Array) => a.length === b.length && timingSafeEqual(a, b);

function checkClientData(json: Uint8Array, type: string, challenge: string, rp: RelyingParty): void {
  let data: { type?: unknown; challenge?: unknown; origin?: unknown; crossOrigin?: unknown } = {};
  try {
    data = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(json)) ?? {};
  } catch {
    fail("clientDataJSON is not JSON");
  }
  if (typeof data !== "object") fail("clientDataJSON is not an object");
  if (data.type !== type) fail(`clientDataJSON.type is not ${type}`);
  if (typeof data.challenge !== "string" || !equalBytes(Buffer.from(data.challenge), Buffer.from(challenge)))
    fail("clientDataJSON.challenge does not match");
  if (data.origin !== rp.origin) fail("clientDataJSON.origin does not match");
  if (data.crossOrigin === true) fail("cross-origin ceremonies are not accepted");
}

function checkAuthData(data: AuthenticatorData, rp: RelyingParty): void {
  if (!equalBytes(data.rpIdHash, sha256(rp.id))) fail("authenticator data is for another relying party");
  if (!data.userPresent) fail("the user was not present");
}

/** A registration (navigator.credentials.create): the new credential's id, key and counter. */
export function verifyRegistration(input: {
  credentialId: Uint8Array;
  clientDataJson: Uint8Array;
  attestationObject: Uint8Array;
  challenge: string;
  rp: RelyingParty;
}) {
  checkClientData(input.clientDataJson, "webauthn.create", input.challenge, input.rp);
  const attestation = decodeCbor(input.attestationObject).value;
  if (!(attestation instanceof Map)) return fail("attestationObject is not a map");
  const authDataBytes = attestation.get("authData");
  if (!(authDataBytes instanceof Uint8Array)) return fail("attestationObject has no authData");
  const authData = parseAuthenticatorData(authDataBytes);
  checkAuthData(authData, input.rp);
  if (!authData.credential) return fail("no attested credential data");
  if (!equalBytes(authData.credential.id, input.credentialId)) fail("credential id does not match");
  return { key: coseToJwk(authData.credential.publicKey), signCount: authData.signCount };
}

/** An assertion (navigator.credentials.get) by a stored credential; returns the new counter. */
export function verifyAssertion(input: {
  key: StoredCredentialKey;
  storedSignCount: number;
  clientDataJson: Uint8Array;
  authenticatorData: Uint8Array;
  signature: Uint8Array;
  challenge: string;
  rp: RelyingParty;
}): number {
  checkClientData(input.clientDataJson, "webauthn.get", input.challenge, input.rp);
  const authData = parseAuthenticatorData(input.authenticatorData);
  checkAuthData(authData, input.rp);
  const signed = Buffer.concat([input.authenticatorData, sha256(input.clientDataJson)]);
  // Passkeys registered before points were checked may hold one off the curve: no signature is its.
  const key = keyFromJwk(input.key) ?? fail("the stored passkey's public key is not usable");
  let ok = false;
  try {
    ok =
      input.key.alg === -8
        ? verify(null, signed, key, input.signature)
        : verify("sha256", signed, { key, dsaEncoding: "der" }, input.signature);
  } catch {
    // A malformed DER signature throws instead of returning false.
    ok = false;
  }
  if (!ok) fail("the signature does not verify");
  // A counter that does not grow (when either side counts) points at a cloned authenticator.
  if (
    (authData.signCount !== 0 || input.storedSignCount !== 0) &&
    authData.signCount <= input.storedSignCount
  )
    fail("the signature counter did not increase");
  return authData.signCount;
}
