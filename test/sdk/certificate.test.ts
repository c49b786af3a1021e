import { beforeEach, describe, expect, test } from "bun:test";
import { createPrivateKey, sign as nodeSign } from "node:crypto";
import {
  b64uDecode,
  b64uEncode,
  resolveConfig,
  type TrustBundle,
  verifyCertificate,
  verifyTrustBundle,
} from "../../src/sdk/index.ts";
import { Authority, edKey, T0 } from "./support/authority.ts";
import { expectCode } from "./support/expect.ts";

const JKT = "a".repeat(64);
const ACT = "act_1";
let authority: Authority;

beforeEach(() => {
  authority = new Authority();
});

function bundle(): TrustBundle {
  const config = resolveConfig(authority.config());
  return verifyTrustBundle(authority.signedBundle(), { config, highestSequence: 0 }).bundle;
}

function check(jws: string, extra: { licenseId?: string; at?: number } = {}) {
  return verifyCertificate(jws, {
    bundle: bundle(),
    productId: authority.productId,
    deviceThumbprint: JKT,
    activationId: ACT,
    ...(extra.licenseId === undefined ? {} : { licenseId: extra.licenseId }),
    ...(extra.at === undefined ? {} : { notBeforeCheckAt: extra.at, nbfLeewaySec: 60 }),
  });
}

const cert = (opts: Partial<Parameters<Authority["certificate"]>[0]> = {}) =>
  authority.certificate({ jkt: JKT, activationId: ACT, ...opts });

describe("license certificate verification", () => {
  test("a certificate signed by a bundle key for this device, product and activation is accepted", () => {
    const verified = check(cert(), { licenseId: "lic_01JTESTLICENSE00000000000000", at: T0 });
    expect(verified.header).toEqual({
      alg: "EdDSA",
      kid: authority.parent.keyId,
      typ: "service-license+jwt",
    });
    expect(verified.claims.license.entitlements).toEqual({ pro: true, seats: 5 });
    expect(verified.claims.heartbeat.grace_sec).toBe(7200);
  });

  test("a certificate whose signing input was made by Node's Ed25519 verifies the same way", () => {
    const jws = cert();
    const [h, p] = jws.split(".");
    const seed = authority.parent.secret;
    const der = Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), Buffer.from(seed)]);
    const key = createPrivateKey({ key: der, format: "der", type: "pkcs8" });
    const sig = nodeSign(null, Buffer.from(`${h}.${p}`), key).toString("base64url");
    expect(check(`${h}.${p}.${sig}`).claims.activation_id).toBe(ACT);
  });

  test("a certificate bound to another device key is refused", () => {
    expectCode(() => check(cert({ jkt: "b".repeat(64) })), "CERTIFICATE_DEVICE_MISMATCH");
  });

  test("a certificate for another product, activation or license is refused", () => {
    expectCode(() => check(cert({ claims: { aud: "prod_other" } })), "CERTIFICATE_MISMATCH");
    expectCode(() => check(cert({ activationId: "act_2" })), "CERTIFICATE_MISMATCH");
    expectCode(() => check(cert(), { licenseId: "lic_other" }), "CERTIFICATE_MISMATCH");
  });

  test("a certificate whose nbf lies beyond the leeway after the signed server time is refused", () => {
    expectCode(() => check(cert({ claims: { nbf: T0 + 61 } }), { at: T0 }), "CERTIFICATE_NOT_YET_VALID");
    expect(check(cert({ claims: { nbf: T0 + 60 } }), { at: T0 }).claims.nbf).toBe(T0 + 60);
  });

  test("a certificate from a key outside the bundle or from a compromised key is refused", () => {
    const stranger = { ...edKey(), status: "active" as const, not_before: 0, not_after: null };
    expectCode(() => check(cert({ signer: stranger })), "KEY_UNKNOWN");
    authority.signing[0]!.status = "compromised";
    expectCode(() => check(cert()), "KEY_COMPROMISED");
  });

  test("a certificate naming a bundle key but signed by another key is refused", () => {
    const stranger = { ...edKey(), status: "active" as const, not_before: 0, not_after: null };
    const jws = cert({ signer: stranger, header: { kid: authority.parent.keyId } });
    expectCode(() => check(jws), "CERTIFICATE_SIGNATURE_INVALID");
  });

  test("altered claims, truncated and forged signatures are refused", () => {
    const [h, , s] = cert().split(".") as [string, string, string];
    const [, p2] = cert({ claims: { exp: T0 + 10 * 365 * 86_400 } }).split(".");
    expectCode(() => check(`${h}.${p2}.${s}`), "CERTIFICATE_SIGNATURE_INVALID");
    const [, p] = cert().split(".");
    expectCode(
      () => check(`${h}.${p}.${b64uEncode(b64uDecode(s).subarray(0, 63))}`),
      "CERTIFICATE_SIGNATURE_INVALID",
    );
    expectCode(() => check(`${h}.${p}.${b64uEncode(new Uint8Array(64))}`), "CERTIFICATE_SIGNATURE_INVALID");
  });

  test("wrong algorithms, types, critical headers and malformed serializations are refused", () => {
    expectCode(() => check(cert({ header: { alg: "none" } })), "CERTIFICATE_INVALID");
    expectCode(() => check(cert({ header: { alg: "ES256" } })), "CERTIFICATE_INVALID");
    expectCode(() => check(cert({ header: { typ: "JWT" } })), "CERTIFICATE_INVALID");
    expectCode(() => check(cert({ header: { crit: ["exp"] } })), "CERTIFICATE_INVALID");
    expectCode(() => check(cert().split(".").slice(0, 2).join(".")), "CERTIFICATE_INVALID");
    const [h, p, s] = cert().split(".");
    expectCode(() => check(`${h}=.${p}.${s}`), "CERTIFICATE_INVALID");
    expectCode(() => check(cert({ claims: { exp: "tomorrow" } })), "CERTIFICATE_INVALID");
  });
});
