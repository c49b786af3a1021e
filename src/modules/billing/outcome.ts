export type Result = "succeeded" | "ignored" | "failed";

/** What applying one provider event did, as recorded with its event id and shown as `last_event`. */
export interface Outcome {
  result: Result;
  reason: string | null;
  licenseId?: string | null;
}

export const done = (
  result: Result,
  reason: string | null = null,
  licenseId: string | null = null,
): Outcome => ({
  result,
  reason,
  licenseId,
});
