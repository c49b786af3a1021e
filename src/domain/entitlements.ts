/**
 * The rules of an entitlement map (a policy's entitlements, a license's overrides): one place, so
 * policies and licenses refuse the same things with the same words (docs/api.md "Policies").
 */

export const ENTITLEMENT_NAME = /^[a-z0-9][a-z0-9_.:-]{0,63}$/;
/** {@link ENTITLEMENT_NAME} in words, for messages: "must be …". */
export const ENTITLEMENT_NAME_RULE = "1-64 of a-z 0-9 _ . : - starting with a letter or digit";
export const MAX_ENTITLEMENTS = 200;
/**
 * An entitlement map as JSON, at most: it is signed into every certificate and heartbeat answer
 * and shown in every license of a list, so 60 KB maps made a page of 200 licenses 36 MB. 8 KiB
 * holds 200 flags or limits with room to spare.
 */
export const MAX_ENTITLEMENTS_BYTES = 8 * 1024;

type Report = (field: string, message: string) => void;

/**
 * A value is `true`/`false`, or a JSON value for limits (DESIGN §4). Entitlements are signed into
 * certificates, so every number in one stays within I-JSON (DESIGN §5, RFC 7493): an integer
 * within ±(2^53−1). A fraction, or a larger number (which JSON.parse already rounded: 2^53 + 1
 * arrives as 2^53), is refused rather than signed as something another parser may read differently.
 */
const VALUE_RULE = `numbers must be integers between -${Number.MAX_SAFE_INTEGER} and ${Number.MAX_SAFE_INTEGER} (signed data stays within I-JSON)`;

function checkValue(path: string, value: unknown, add: Report): void {
  if (typeof value === "number") {
    if (!Number.isSafeInteger(value)) add(path, VALUE_RULE);
  } else if (typeof value === "object" && value !== null) {
    // Arrays too: their entries are keyed by index (`entitlements.tiers.1`).
    for (const [key, item] of Object.entries(value)) checkValue(`${path}.${key}`, item, add);
  }
}

/** At most MAX_ENTITLEMENTS names and MAX_ENTITLEMENTS_BYTES as JSON; reported on `field` itself. */
export function checkEntitlementSize(
  field: string,
  entitlements: Record<string, unknown>,
  add: Report,
): void {
  if (Object.keys(entitlements).length > MAX_ENTITLEMENTS)
    add(field, `at most ${MAX_ENTITLEMENTS} entitlements`);
  if (Buffer.byteLength(JSON.stringify(entitlements)) > MAX_ENTITLEMENTS_BYTES)
    add(field, `at most ${MAX_ENTITLEMENTS_BYTES} bytes as JSON`);
}

/**
 * Each entry of the map, reported on `<field>.<name>` (a nested value on its path); its size on
 * `field`, unless `size` is false (a stored map, not sent: see policyViolations).
 */
export function checkEntitlementMap(
  field: string,
  entitlements: Record<string, unknown>,
  add: Report,
  options: { size?: boolean } = {},
): void {
  const names = Object.keys(entitlements);
  if (options.size !== false) checkEntitlementSize(field, entitlements, add);
  for (const name of names) {
    if (!ENTITLEMENT_NAME.test(name)) add(`${field}.${name}`, `names must be ${ENTITLEMENT_NAME_RULE}`);
    checkValue(`${field}.${name}`, entitlements[name], add);
  }
}
