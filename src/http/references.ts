import { ApiError, type FieldErrorCollector } from "./errors.ts";

/**
 * A resource named in a request body: when it does not exist for the caller, that is a field error
 * (422 keyed by the field), not a 404 of the route.
 */
export function bodyReference<T>(lookup: () => T, field: string, errors: FieldErrorCollector): T | undefined {
  try {
    return lookup();
  } catch (error) {
    if (error instanceof ApiError && error.code === "NOT_FOUND") {
      errors.add(field, "does not exist for this key");
      return undefined;
    }
    throw error;
  }
}
