import { Type } from "@sinclair/typebox";
import {
  EMAIL_ADDRESS_MAX_LENGTH,
  EMAIL_ADDRESS_PATTERN,
  type EmailAddress,
  parseEmailAddress,
} from "../domain/email-address.ts";
import { ApiError } from "./errors.ts";

const RULE =
  "must be a plain address like name@example.com: no display name, <>, comment, quotes, list or spaces";

/** An email address in a request body; the pattern is a first filter, `emailField` the full check. */
export const EmailAddressField = (description?: string) =>
  Type.String({
    minLength: 3,
    maxLength: EMAIL_ADDRESS_MAX_LENGTH,
    pattern: EMAIL_ADDRESS_PATTERN,
    ...(description ? { description } : {}),
  });

/** The parsed address, or 422 VALIDATION_FAILED keyed by `field`. */
export function emailField(value: string, field = "email"): EmailAddress {
  const parsed = parseEmailAddress(value);
  if (!parsed) throw ApiError.validation({ [field]: [RULE] });
  return parsed;
}
