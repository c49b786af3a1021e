/**
 * The rules of an entitlement map (a policy's entitlements, a license's overrides): one place, so
 * policies and licenses refuse the same things with the same words (docs/api.md "Policies").
 */

export const ENTITLEMENT_NAME = /^[a-z0-9][a-z0-9_.:-]{0,63}$/;
export const MAX_ENTITLEMENTS = 200;

type Report = (field: string, message: string) => void;

/** At most MAX_ENTITLEMENTS names; reported on `field` itself. */
export function checkEntitlementCount(field: string, names: number, add: Report): void {
  if (names > MAX_ENTITLEMENTS) add(field, `at most ${MAX_ENTITLEMENTS} entitlements`);
}

/** Each entry of the map, reported on `<field>.<name>`; the count on `field`. */
export function checkEntitlementMap(field: string, entitlements: Record<string, unknown>, add: Report): void {
  const names = Object.keys(entitlements);
  checkEntitlementCount(field, names.length, add);
  for (const name of names) {
    if (!ENTITLEMENT_NAME.test(name))
      add(`${field}.${name}`, "names are 1-64 of a-z 0-9 _ . : - and start with a letter or digit");
  }
}
