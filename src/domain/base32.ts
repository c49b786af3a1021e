/** Crockford base32: no I, L, O, U, so keys survive being read aloud or retyped. */
export const CROCKFORD_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** `count` uniformly random Crockford characters: each byte's low 5 bits index the alphabet (256 % 32 == 0, so no bias). */
export function randomCrockford(count: number): string {
  const bytes = crypto.getRandomValues(new Uint8Array(count));
  let out = "";
  for (const byte of bytes) out += CROCKFORD_ALPHABET[byte & 31];
  return out;
}

/** Maps the characters Crockford treats as aliases (I, L -> 1; O -> 0) and upper-cases. */
export function normalizeCrockford(input: string): string {
  return input.toUpperCase().replace(/[IL]/g, "1").replace(/O/g, "0");
}
