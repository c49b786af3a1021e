import { randomBytes } from "node:crypto";
import { b64u } from "../../crypto/encoding.ts";
import { signCompactJws } from "../../crypto/jws.ts";
import { unixSeconds } from "../../domain/clock.ts";
import { licenseStatus } from "../../domain/license-state.ts";
import type { PolicySettings } from "../../domain/policy-rules.ts";
import type { LicenseRow } from "../licenses/service.ts";
import type { TrustService } from "../trust/service.ts";

/** How far `nbf` precedes `iat`, so a device whose clock runs a little behind can use it at once. */
export const CERTIFICATE_NBF_LEEWAY_SEC = 300;

export interface CertificateSubject {
  license: LicenseRow;
  policy: PolicySettings & { id: string };
  activationId: string;
  deviceThumbprint: string;
  machineInfoDigest: string;
}

/** What a certificate says of an activation: its device, its machine and its license's terms. */
export function certificateSubject(
  license: LicenseRow,
  policy: CertificateSubject["policy"],
  activation: { id: string; deviceThumbprint: string; machineInfoDigest: string },
): CertificateSubject {
  return {
    license,
    policy,
    activationId: activation.id,
    deviceThumbprint: activation.deviceThumbprint,
    machineInfoDigest: activation.machineInfoDigest,
  };
}

/**
 * The `license` claim of a certificate: the license's terms as the device will enforce them. An
 * offline package's replay compares it with the stored certificate's, so a license whose terms
 * changed since is not answered with a package stating the old ones.
 */
export function licenseClaim(license: LicenseRow, policy: CertificateSubject["policy"], now: Date) {
  return {
    status: licenseStatus(license, now),
    type: license.licenseType,
    expires_at: license.expiresAt ? unixSeconds(license.expiresAt) : null,
    entitlements: { ...policy.entitlements, ...license.entitlements },
    policy_id: policy.id,
    max_concurrent: license.maxConcurrentOverride ?? policy.max_concurrent,
  };
}

/**
 * The license certificate of DESIGN §5: a JWS (EdDSA) by the product's active signing key,
 * bound to the device key by `cnf.jkt`. It never outlives the license.
 *
 * `offlineUntil` makes the certificate of an offline package: its `exp` is the package expiry
 * (the caller keeps that within the license's), and it asks for no heartbeats and grants no grace,
 * because a device that never goes online has nothing to renew it with.
 */
export function issueCertificate(
  trust: Pick<TrustService, "signingKey">,
  issuer: string,
  subject: CertificateSubject,
  now: Date,
  options: { offlineUntil?: number } = {},
): { certificate: string; expiresAt: Date } {
  const { license, policy } = subject;
  const iat = unixSeconds(now);
  const licenseExpiry = license.expiresAt ? unixSeconds(license.expiresAt) : null;
  // Never past the license's expiry, and never before iat: a suspended license whose expiry has
  // passed gets a certificate that is already over, not one that ends before it begins.
  const online = Math.max(
    iat,
    licenseExpiry === null ? iat + policy.cert_ttl_sec : Math.min(iat + policy.cert_ttl_sec, licenseExpiry),
  );
  const offline = options.offlineUntil !== undefined;
  const exp = options.offlineUntil ?? online;
  const key = trust.signingKey(license.productId);
  const certificate = signCompactJws(
    { alg: "EdDSA", kid: key.keyId, typ: "service-license+jwt" },
    {
      iss: issuer,
      sub: license.id,
      aud: license.productId,
      iat,
      nbf: iat - CERTIFICATE_NBF_LEEWAY_SEC,
      exp,
      jti: b64u.encode(randomBytes(16)),
      activation_id: subject.activationId,
      cnf: { jkt: subject.deviceThumbprint },
      machine_info_digest: subject.machineInfoDigest,
      license: licenseClaim(license, policy, now),
      heartbeat: {
        required: offline ? false : policy.heartbeat_required,
        interval_sec: policy.heartbeat_sec,
        // A device failing closed gets no grace: the certificate's expiry is the end.
        grace_sec: !offline && policy.fail_mode === "open" ? policy.network_grace_sec : 0,
      },
    },
    key.privateKey,
  );
  return { certificate, expiresAt: new Date(exp * 1000) };
}
