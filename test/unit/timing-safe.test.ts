import { describe, expect, test } from "bun:test";
import { createHmac, randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Secret, TOTP } from "otpauth";
import { constantTimeEqual } from "../../src/crypto/constant-time.ts";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import { codeMatches, hashCode } from "../../src/domain/verification-code.ts";
import { signatureMatches } from "../../src/modules/billing/stripe.ts";
import { type Comparison, secretComparisons } from "../support/comparison-scan.ts";

/**
 * The security review of issue 8, "timing-safe comparisons for every secret", as tests. A secret a
 * client sends is either compared with `timingSafeEqual` (directly or through
 * `constantTimeEqual`), or looked up by an index over its hash, which is not a comparison of the
 * secret: API keys by SHA-256 (a 190-bit random token: learning bytes of its hash gives nothing to
 * invert), license keys, recovery codes, named-user tokens and claim tokens by an HMAC under the
 * data key. The scan below finds `===`-style and method comparisons whose operand names secret
 * material; each exception is a reviewed site with its reason.
 */
const root = join(import.meta.dir, "../..");

interface Reviewed {
  file: string;
  text: string;
  reason: string;
}
const reviewed = (reason: string, ...sites: [file: string, text: string][]): Reviewed[] =>
  sites.map(([file, text]) => ({ file, text, reason }));

const ALLOWED: Reviewed[] = [
  ...reviewed(
    "a digest of the device's own machine info, which the device itself sends and is told back",
    ["src/modules/activations/machine.ts", "body.machine_info_digest !== activation.machineInfoDigest"],
    ["src/sdk/client-offline.ts", "machineInfoDigest(info) === digest"],
    ["src/sdk/client-offline.ts", "stored?.machine_info_digest === digest"],
    ["src/sdk/client-activation-store.ts", "data.machine_info_digest !== digest"],
    ["src/sdk/client.ts", "data.machine_info_digest !== expectedDigest"],
  ),
  ...reviewed("a product code is a public identifier", [
    "src/modules/products/service.ts",
    "patch.code !== current.code",
  ]),
  ...reviewed("checks the public `whsec_` prefix of a secret we generated, not a secret a client sent", [
    "src/modules/webhooks/signing.ts",
    "secret.startsWith(SECRET_PREFIX)",
  ]),
  ...reviewed(
    "the operator's own keystore passphrase against the file the backup command just wrote it to, on the operator's machine: nothing an attacker can time",
    ["src/cli/backup.ts", "readBack !== passphrase"],
  ),
  ...reviewed("a device's public KEM key", [
    "src/modules/activations/device-keys.ts",
    "existing.deviceKemKey !== kemKey",
  ]),
  ...reviewed(
    "the SHA-256 of the caller's own request body, under the caller's own API key and Idempotency-Key",
    ["src/http/idempotency.ts", "earlier.fingerprint !== fingerprint"],
  ),
  ...reviewed(
    "two server-held values: a verification's stored address hash and the hash of the user's stored address, under the current key or the one before it (no client input)",
    [
      "src/modules/email-verifications/sign-in-state.ts",
      "row.addressHash === mailboxHash(secrets, emailNormalized)",
    ],
    [
      "src/modules/email-verifications/sign-in-state.ts",
      'row.addressHash === secrets.lookupHash(older, "email-verification-address")',
    ],
  ),
  ...reviewed(
    "the hash of a migration's SQL, public and compared at start-up",
    ["src/store/migrate.ts", "recorded !== migration.hash"],
    ["src/store/migrate.ts", "recorded === migration.hash"],
  ),
  ...reviewed(
    "the SDK checks public data on the client's machine: field names, error codes, a signed body's digest",
    ["src/sdk/sealed.ts", "FIELDS.includes(key)"],
    ["src/sdk/errors.ts", "(LICENSE_DENIAL_CODES as readonly string[]).includes(code)"],
    ["src/sdk/verify.ts", "bodyHash !== assertion.body_sha256"],
  ),
];

/** The places that check a secret a client sends, and must do so in constant time. */
const VERIFIERS: { file: string; checks: string }[] = [
  { file: "src/crypto/constant-time.ts", checks: "the project's helper itself" },
  { file: "src/modules/billing/stripe.ts", checks: "Stripe-Signature HMACs" },
  { file: "src/domain/verification-code.ts", checks: "emailed verification codes (trials, named users)" },
  { file: "src/modules/trials/service.ts", checks: "a trial confirmation's address (HMAC lookup)" },
  { file: "src/modules/metrics/index.ts", checks: "the metrics token" },
  { file: "src/crypto/keystore-document.ts", checks: "the keystore's MAC (the passphrase)" },
];

function sourceFiles(dir: string): string[] {
  return readdirSync(join(root, dir), { withFileTypes: true }).flatMap((entry) => {
    const path = `${dir}/${entry.name}`;
    if (entry.isDirectory()) return sourceFiles(path);
    return path.endsWith(".ts") ? [path] : [];
  });
}

const key = (c: Pick<Comparison, "file" | "text">) => `${c.file}: ${c.text}`;

describe("the source review", () => {
  const found = sourceFiles("src").flatMap((file) =>
    secretComparisons(file, readFileSync(join(root, file), "utf8")),
  );

  test("no comparison of secret material in src/ uses ===, !== or a string method, outside the reviewed sites", () => {
    const allowed = new Set(ALLOWED.map(key));
    const offenders = found.filter((c) => !allowed.has(key(c))).map((c) => `${c.file}:${c.line}  ${c.text}`);
    expect(offenders).toEqual([]);
  });

  test("every reviewed exception still exists, so the list cannot hide a new site by going stale", () => {
    const present = new Set(found.map(key));
    expect(ALLOWED.filter((entry) => !present.has(key(entry))).map(key)).toEqual([]);
    for (const entry of ALLOWED) expect(entry.reason.length).toBeGreaterThan(10);
  });

  test("every verifier of a client's secret goes through timingSafeEqual or constantTimeEqual", () => {
    for (const { file, checks } of VERIFIERS) {
      const source = readFileSync(join(root, file), "utf8");
      expect({ file, checks, constantTime: /\b(timingSafeEqual|constantTimeEqual)\(/.test(source) }).toEqual({
        file,
        checks,
        constantTime: true,
      });
    }
    expect(readFileSync(join(root, "src/crypto/constant-time.ts"), "utf8")).toContain("timingSafeEqual(");
  });

  test("TOTP codes are checked by otpauth with its constant-time compare (a dependency reviewed, pinned here)", () => {
    const library = readFileSync(Bun.resolveSync("otpauth", join(root, "src")), "utf8");
    expect(library).toContain("if (timingSafeEqual(token, generatedToken))");
    const helper = library.slice(library.indexOf("const timingSafeEqual"), library.indexOf("class HOTP"));
    expect(helper).toContain("out |= a.charCodeAt(i) ^ b.charCodeAt(i)");
  });
});

describe("the scan itself", () => {
  const scan = (source: string) => secretComparisons("x.ts", source).map((c) => c.text);

  test("flags equality and method comparisons of secrets, however they are spelled or wrapped", () => {
    expect(
      scan(`
        if (sent === expectedToken) ok();
        return row.token_hash !== sha256Hex(token);
        const same = signature.equals(expected);
        const ok =
          provided
            .trim() == storedSecret;
        if (candidates.includes(webhookSecret)) ok();
        if (Buffer.compare(a, hmac) === 0) ok();
        if (recoveryCodes[0]!.codeHash === hash) ok();
      `),
    ).toEqual([
      "sent === expectedToken",
      "row.token_hash !== sha256Hex(token)",
      "provided .trim() == storedSecret",
      "recoveryCodes[0]!.codeHash === hash",
      "signature.equals(expected)",
      "candidates.includes(webhookSecret)",
      "Buffer.compare(a, hmac)",
    ]);
  });

  test("leaves literals, metadata, public values, comments and strings alone", () => {
    expect(
      scan(`
        if (key === "t") parse();
        if (signatures.length === 0 || user.totpStatus !== "enabled") return;
        if (row.previous_secret_expires_at !== null && keyIdOf(pub) !== anchor.key_id) stop();
        if (a.publicKey === b.publicKey) same();
        // if (token === other) is only a comment
        const text = "secret === other";
        const re = /token === x/;
        const t = \`\${a} token === \${b}\`;
        if (timingSafeEqual(candidate, expected)) ok();
        if (typeof token === "string") ok();
      `),
    ).toEqual([]);
  });
});

describe("constantTimeEqual", () => {
  test("is true for equal values, as strings, bytes or a mix", () => {
    expect(constantTimeEqual("lsk_live_abc", "lsk_live_abc")).toBe(true);
    expect(constantTimeEqual("", "")).toBe(true);
    const bytes = randomBytes(32);
    expect(constantTimeEqual(bytes, Buffer.from(bytes))).toBe(true);
    expect(constantTimeEqual("é", Buffer.from("é", "utf8"))).toBe(true);
  });

  test("is false for unequal values of the same length, wherever they differ", () => {
    const base = "a".repeat(64);
    for (const at of [0, 31, 63]) {
      const other = `${base.slice(0, at)}b${base.slice(at + 1)}`;
      expect(constantTimeEqual(base, other)).toBe(false);
    }
    expect(constantTimeEqual(randomBytes(32), randomBytes(32))).toBe(false);
  });

  test("is false, and never throws, for values of different lengths", () => {
    for (const [a, b] of [
      ["abc", "abcd"],
      ["", "x"],
      ["x".repeat(10_000), "x"],
    ] as const) {
      expect(() => constantTimeEqual(a, b)).not.toThrow();
      expect(constantTimeEqual(a, b)).toBe(false);
      expect(constantTimeEqual(b, a)).toBe(false);
    }
  });
});

describe("the other constant-time checks", () => {
  const secrets = new SecretBox(randomBytes(32));

  test("an emailed code against a stored hash of any length or form answers false and never throws", () => {
    const stored = hashCode(secrets, "ver_1", "123456");
    expect(codeMatches(secrets, "ver_1", "123456", stored)).toBe(true);
    expect(codeMatches(secrets, "ver_1", "123457", stored)).toBe(false);
    for (const malformed of ["", "00", stored.slice(0, 63), `${stored}00`, "not hex at all"]) {
      expect(() => codeMatches(secrets, "ver_1", "123456", malformed)).not.toThrow();
      expect(codeMatches(secrets, "ver_1", "123456", malformed)).toBe(false);
    }
  });

  test("Stripe signatures of the wrong length are refused without throwing; the right one among them passes", () => {
    const secret = `whsec_${"k".repeat(32)}`;
    const body = new TextEncoder().encode('{"id":"evt_1"}');
    const timestamp = 1_700_000_000;
    const good = createHmac("sha256", secret).update(`${timestamp}.`).update(body).digest();
    const wrong = [Buffer.alloc(0), good.subarray(0, 31), Buffer.concat([good, Buffer.from([0])])];
    expect(signatureMatches(secret, { timestamp, signatures: wrong }, body)).toBe(false);
    expect(signatureMatches(secret, { timestamp, signatures: [...wrong, good] }, body)).toBe(true);
    const flipped = Buffer.from(good);
    flipped[31] = (flipped[31] as number) ^ 1;
    expect(signatureMatches(secret, { timestamp, signatures: [flipped] }, body)).toBe(false);
  });

  test("a TOTP code of the wrong length is refused without throwing", () => {
    const totp = new TOTP({ secret: new Secret({ size: 20 }), digits: 6, period: 30 });
    const timestamp = Date.UTC(2026, 10, 22);
    expect(totp.validate({ token: totp.generate({ timestamp }), timestamp, window: 1 })).toBe(0);
    for (const token of ["", "12345", "1234567", "x".repeat(100)])
      expect(totp.validate({ token, timestamp, window: 1 })).toBeNull();
  });
});
