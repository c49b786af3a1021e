import { ApiError } from "../../http/errors.ts";

/**
 * A device binding itself again (online activation, trial confirmation, an offline package) must
 * bring the KEM key its activation holds. Sealed-file keys are sealed to that key, so quietly
 * keeping the old one would leave a device that rebuilt its KEM key unable to open any sealed
 * file, and never told why. Nor is the new one taken over: offline packages already issued name
 * the old key's thumbprint. The device deactivates first (or keeps its keys) instead.
 */
export function requireSameKemKey(existing: { id: string; deviceKemKey: string }, kemKey: string): void {
  // Both are canonical `p256:` texts (keys.ts decodes canonically), so equal keys are equal strings.
  if (existing.deviceKemKey !== kemKey) {
    throw new ApiError(
      "DEVICE_KEY_MISMATCH",
      "This device is active with another KEM key; deactivate it first or use the same keys.",
      { activation_id: existing.id },
    );
  }
}
