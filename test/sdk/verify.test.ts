import { beforeEach, describe, expect, test } from "bun:test";
import {
  b64uDecode,
  b64uEncode,
  resolveConfig,
  type TrustBundle,
  verifyEnvelope,
  verifyTrustBundle,
} from "../../src/sdk/index.ts";
import { Authority, edKey, type Json, T0 } from "./support/authority.ts";
import { expectCode } from "./support/expect.ts";

const NONCE = "nonce-nonce-nonce-nonce-1";
let authority: Authority;

beforeEach(() => {
  authority = new Authority();
});

function config() {
  return resolveConfig(authority.config());
}

function bundle(): TrustBundle {
  return verifyTrustBundle(authority.signedBundle(), { config: config(), highestSequence: 0 }).bundle;
}

function check(env: unknown, opts: { nonce?: string; status?: number; field?: "data" | "error" } = {}) {
  return verifyEnvelope(env, {
    bundle: bundle(),
    productId: authority.productId,
    nonce: opts.nonce ?? NONCE,
    status: opts.status ?? 200,
    payloadField: opts.field ?? "data",
  });
}

function envelope(
  extra: Partial<Parameters<Authority["envelope"]>[1]> = {},
  payload: unknown = { ok: 1 },
): Json {
  return authority.envelope(payload, { nonce: NONCE, status: 200, ...extra });
}

function truncate(sig: string): string {
  return b64uEncode(b64uDecode(sig).subarray(0, 63));
}

describe("trust bundle verification", () => {
  test("a bundle signed by the configured root is accepted with its signing keys", () => {
    const verified = verifyTrustBundle(authority.signedBundle(), { config: config(), highestSequence: 2 });
    expect(verified.bundle.sequence).toBe(3);
    expect(verified.bundle.signing_keys.map((k) => k.key_id)).toEqual([authority.parent.keyId]);
  });

  test("a bundle signed by another root key is refused even when it names the configured root", () => {
    const forged = authority.signedBundle({ signer: edKey() });
    expectCode(
      () => verifyTrustBundle(forged, { config: config(), highestSequence: 0 }),
      "BUNDLE_SIGNATURE_INVALID",
    );
  });

  test("a bundle that names another root key id is refused", () => {
    const other = authority.signedBundle({ overrides: { root_key_id: edKey().keyId } });
    expectCode(
      () => verifyTrustBundle(other, { config: config(), highestSequence: 0 }),
      "BUNDLE_ROOT_MISMATCH",
    );
  });

  test("changing any bundle field after signing breaks the root signature", () => {
    const changes: [string, (b: Json) => void][] = [
      [
        "product_id",
        (b) => {
          b.product_id = "prod_other";
        },
      ],
      [
        "environment",
        (b) => {
          b.environment = "test";
        },
      ],
      [
        "sequence",
        (b) => {
          b.sequence = 99;
        },
      ],
      [
        "issued_at",
        (b) => {
          b.issued_at = 1;
        },
      ],
      [
        "v",
        (b) => {
          b.v = 2;
        },
      ],
      [
        "key status",
        (b) => {
          (b.signing_keys as Json[])[0]!.status = "retired";
        },
      ],
      [
        "key not_after",
        (b) => {
          (b.signing_keys as Json[])[0]!.not_after = T0;
        },
      ],
      [
        "extra key",
        (b) => {
          const k = edKey();
          (b.signing_keys as Json[]).push({
            key_id: k.keyId,
            public_key: k.publicKey,
            status: "active",
            not_before: 0,
            not_after: null,
          });
        },
      ],
      [
        "extra field",
        (b) => {
          b.note = "x";
        },
      ],
    ];
    for (const [, change] of changes) {
      const signed = authority.signedBundle();
      change(signed.bundle as Json);
      expectCode(
        () => verifyTrustBundle(signed, { config: config(), highestSequence: 0 }),
        "BUNDLE_SIGNATURE_INVALID",
      );
    }
  });

  test("a truncated or forged root signature is refused", () => {
    const signed = authority.signedBundle();
    const truncated = { ...signed, root_signature: truncate(signed.root_signature as string) };
    const zero = { ...signed, root_signature: b64uEncode(new Uint8Array(64)) };
    for (const bad of [truncated, zero, { ...signed, root_signature: "" }]) {
      expectCode(
        () => verifyTrustBundle(bad, { config: config(), highestSequence: 0 }),
        "BUNDLE_SIGNATURE_INVALID",
      );
    }
  });

  test("a bundle with a lower sequence than the one held is refused as a rollback, an equal one is accepted", () => {
    const signed = authority.signedBundle();
    const e = expectCode(
      () => verifyTrustBundle(signed, { config: config(), highestSequence: 4 }),
      "BUNDLE_SEQUENCE_ROLLBACK",
    );
    expect(e.details).toMatchObject({ sequence: 3, minimum: 4 });
    expect(e.message).toBe("bundle is older than one already trusted");
    expect(verifyTrustBundle(signed, { config: config(), highestSequence: 3 }).bundle.sequence).toBe(3);
  });

  test("a bundle below minimum_trust_bundle_sequence of the config is refused, and told so", () => {
    const cfg = authority.config();
    (cfg.trust_anchor as Json).minimum_trust_bundle_sequence = 10;
    const e = expectCode(
      () => verifyTrustBundle(authority.signedBundle(), { config: resolveConfig(cfg), highestSequence: 0 }),
      "BUNDLE_SEQUENCE_ROLLBACK",
    );
    // The device trusts no bundle yet: nothing was rolled back, the config asks for a newer one.
    expect(e.message).toBe("bundle is below the config's minimum_trust_bundle_sequence");
  });

  test("a correctly signed bundle for another product or environment is refused", () => {
    const product = authority.signedBundle({ overrides: { product_id: "prod_other" } });
    expectCode(
      () => verifyTrustBundle(product, { config: config(), highestSequence: 0 }),
      "PRODUCT_MISMATCH",
    );
    const env = authority.signedBundle({ overrides: { environment: "test" } });
    expectCode(
      () => verifyTrustBundle(env, { config: config(), highestSequence: 0 }),
      "BUNDLE_ENVIRONMENT_MISMATCH",
    );
  });

  test("the test environment trusts the development root and not the live root", () => {
    authority.environment = "test";
    const ok = verifyTrustBundle(authority.signedBundle(), { config: config(), highestSequence: 0 });
    expect(ok.bundle.environment).toBe("test");
    const byLive = authority.signedBundle({ signer: authority.root });
    expectCode(
      () => verifyTrustBundle(byLive, { config: config(), highestSequence: 0 }),
      "BUNDLE_SIGNATURE_INVALID",
    );
  });

  test("a signed bundle whose key id does not derive from its public key is refused", () => {
    authority.signing[0]!.keyId = "k_00000000000000000000";
    expectCode(
      () => verifyTrustBundle(authority.signedBundle(), { config: config(), highestSequence: 0 }),
      "BUNDLE_INVALID",
    );
  });
});

describe("signed envelope verification", () => {
  test("a correct chain is accepted and yields the data, assertion and delegation", () => {
    const result = check(envelope());
    expect(result.payload).toEqual({ ok: 1 });
    expect(result.assertion.server_time).toBe(T0);
    expect(result.delegation.online_key_id).toBe(authority.online.keyId);
  });

  test("altered data is refused by the body hash", () => {
    const env = envelope();
    env.data = { ok: 2 };
    expectCode(() => check(env), "BODY_HASH_MISMATCH");
  });

  test("altering any assertion field after signing breaks the response signature", () => {
    const changes: Record<string, unknown> = {
      product_id: "prod_other",
      request_id: "req_other",
      nonce: "another-nonce-another-nonce",
      server_time: T0 + 1,
      status: 201,
      body_sha256: "0".repeat(64),
    };
    for (const [field, value] of Object.entries(changes)) {
      const env = envelope();
      const a = env.response_assertion as Json;
      a[field] = value;
      expectCode(() => check(env), "RESPONSE_SIGNATURE_INVALID");
    }
  });

  test("a response honestly signed for another nonce is refused", () => {
    expectCode(() => check(envelope({ nonce: "replayed-nonce-from-before" })), "NONCE_MISMATCH");
  });

  test("a response whose signed status differs from the HTTP status is refused", () => {
    const e = expectCode(() => check(envelope({ status: 201 })), "STATUS_MISMATCH");
    expect(e.details).toEqual({ signed: 201, received: 200 });
  });

  test("a response signed with another body hash is refused", () => {
    expectCode(() => check(envelope({ assertion: { body_sha256: "a".repeat(64) } })), "BODY_HASH_MISMATCH");
  });

  test("a response signed for another product is refused", () => {
    expectCode(() => check(envelope({ assertion: { product_id: "prod_other" } })), "PRODUCT_MISMATCH");
  });

  test("altering any delegation field after signing is refused", () => {
    const other = edKey();
    const changes: [string, unknown, string][] = [
      ["v", 2, "DELEGATION_SIGNATURE_INVALID"],
      ["purpose", "offline-package", "DELEGATION_SIGNATURE_INVALID"],
      ["product_id", "prod_other", "DELEGATION_SIGNATURE_INVALID"],
      ["parent_key_id", other.keyId, "KEY_UNKNOWN"],
      ["online_key_id", other.keyId, "DELEGATION_SIGNATURE_INVALID"],
      ["public_key", other.publicKey, "DELEGATION_SIGNATURE_INVALID"],
      ["issued_at", T0 - 3599, "DELEGATION_SIGNATURE_INVALID"],
      ["expires_at", T0 + 10 * 86_400, "DELEGATION_SIGNATURE_INVALID"],
      ["extra", "field", "DELEGATION_SIGNATURE_INVALID"],
    ];
    for (const [field, value, code] of changes) {
      const env = envelope();
      ((env.signing_delegation as Json).delegation as Json)[field] = value;
      expectCode(() => check(env), code);
    }
  });

  test("an attacker's own online key with a matching delegation it signed itself is refused", () => {
    const attacker = edKey();
    authority.online = attacker;
    const env = envelope({ delegationSigner: edKey() });
    expectCode(() => check(env), "DELEGATION_SIGNATURE_INVALID");
  });

  test("a delegation that has expired at the signed server time is refused", () => {
    authority.signing[0]!.not_before = T0 - 30 * 86_400;
    authority.delegationIssuedAt = T0 - 2 * 86_400;
    authority.delegationLifetime = 86_400;
    expectCode(() => check(envelope()), "DELEGATION_EXPIRED");
  });

  test("a response signed before the delegation was issued is refused", () => {
    authority.delegationIssuedAt = T0 + 60;
    expectCode(() => check(envelope()), "DELEGATION_EXPIRED");
  });

  test("a delegation valid for longer than 7 days is refused and exactly 7 days is accepted", () => {
    authority.delegationLifetime = 7 * 86_400 + 1;
    expectCode(() => check(envelope()), "DELEGATION_INVALID");
    authority.delegationLifetime = 7 * 86_400;
    expect(check(envelope()).payload).toEqual({ ok: 1 });
  });

  test("an assertion naming another online key than the delegation is refused", () => {
    expectCode(() => check(envelope({ assertion: { key_id: edKey().keyId } })), "ONLINE_KEY_MISMATCH");
    expectCode(() => check(envelope({ assertion: { parent_key_id: edKey().keyId } })), "ONLINE_KEY_MISMATCH");
  });

  test("a delegation whose online_key_id does not derive from its public key is refused", () => {
    const other = edKey();
    const env = envelope({ delegation: { online_key_id: other.keyId }, assertion: { key_id: other.keyId } });
    expectCode(() => check(env), "DELEGATION_INVALID");
  });

  test("a response signed by a key other than the delegated online key is refused", () => {
    expectCode(() => check(envelope({ responseSigner: edKey() })), "RESPONSE_SIGNATURE_INVALID");
  });

  test("a delegation by a compromised parent key is refused and one by a retired key is accepted", () => {
    authority.signing[0]!.status = "compromised";
    expectCode(() => check(envelope()), "KEY_COMPROMISED");
    authority.signing[0]!.status = "retired";
    expect(check(envelope()).payload).toEqual({ ok: 1 });
  });

  test("a delegation issued outside its parent key's validity window is refused", () => {
    authority.signing[0]!.not_after = authority.delegationIssuedAt - 1;
    expectCode(() => check(envelope()), "KEY_NOT_VALID");
    authority.signing[0]!.not_after = null;
    authority.signing[0]!.not_before = authority.delegationIssuedAt + 1;
    expectCode(() => check(envelope()), "KEY_NOT_VALID");
    authority.signing[0]!.not_before = authority.delegationIssuedAt;
    authority.signing[0]!.not_after = authority.delegationIssuedAt;
    expect(check(envelope()).payload).toEqual({ ok: 1 });
  });

  test("honestly signed delegations with a wrong version, purpose or product are refused", () => {
    expectCode(() => check(envelope({ delegation: { v: 2 } })), "DELEGATION_INVALID");
    expectCode(() => check(envelope({ delegation: { purpose: "other" } })), "DELEGATION_INVALID");
    expectCode(() => check(envelope({ delegation: { product_id: "prod_other" } })), "PRODUCT_MISMATCH");
  });

  test("an assertion with another version is refused", () => {
    expectCode(() => check(envelope({ assertion: { v: 2 } })), "ASSERTION_INVALID");
  });

  test("truncated and forged response and delegation signatures are refused", () => {
    const a = envelope();
    a.response_signature = truncate(a.response_signature as string);
    expectCode(() => check(a), "RESPONSE_SIGNATURE_INVALID");
    const b = envelope();
    b.response_signature = b64uEncode(new Uint8Array(64).fill(7));
    expectCode(() => check(b), "RESPONSE_SIGNATURE_INVALID");
    const c = envelope();
    const sd = c.signing_delegation as Json;
    sd.signature = truncate(sd.signature as string);
    expectCode(() => check(c), "DELEGATION_SIGNATURE_INVALID");
  });

  test("a response without signature fields is refused as unsigned", () => {
    expectCode(() => check({ data: { ok: 1 } }), "RESPONSE_UNSIGNED");
  });

  test("a signed error is verified over JCS of the error object and not over data", () => {
    const error = {
      code: "LICENSE_REVOKED",
      message: "revoked",
      request_id: "r",
      retryable: false,
      details: {},
    };
    const env = authority.envelope(error, { nonce: NONCE, status: 403, field: "error" });
    expect(check(env, { status: 403, field: "error" }).payload).toEqual(error);
    const asData = authority.envelope(error, { nonce: NONCE, status: 403, field: "data" });
    expectCode(() => check(asData, { status: 403, field: "error" }), "RESPONSE_INVALID");
    (env.error as Json).code = "LICENSE_EXPIRED";
    expectCode(() => check(env, { status: 403, field: "error" }), "BODY_HASH_MISMATCH");
  });
});
