/**
 * The closed set of error codes. Each code has exactly one HTTP status and a default for
 * `retryable`; nothing else in the code base chooses a status for an error.
 */
export const ERROR_CODES = {
  INVALID_REQUEST: { status: 400, retryable: false, title: "The request is malformed" },
  BILLING_SIGNATURE_INVALID: {
    status: 400,
    retryable: false,
    title: "The billing provider's webhook signature is missing, wrong or too old",
  },
  UNAUTHENTICATED: { status: 401, retryable: false, title: "Missing or invalid API key" },
  DEVICE_PROOF_INVALID: { status: 401, retryable: false, title: "Device proof missing, invalid or replayed" },
  CLOCK_SKEW: { status: 401, retryable: false, title: "Device clock differs from the server clock" },
  EMAIL_VERIFICATION_CODE_INVALID: {
    status: 401,
    retryable: false,
    title: "Wrong code, address or device key",
  },
  TWO_FACTOR_REQUIRED: { status: 401, retryable: false, title: "A second factor is required" },
  TWO_FACTOR_INVALID: { status: 401, retryable: false, title: "Wrong second factor" },
  LICENSE_KEY_INVALID: { status: 401, retryable: false, title: "No license with that key for this product" },
  NAMED_USER_TOKEN_INVALID: {
    status: 401,
    retryable: false,
    title: "The named-user token is missing, expired or used",
  },
  PLAN_ENDED: { status: 402, retryable: false, title: "The workspace trial or subscription has ended" },
  INSUFFICIENT_SCOPE: {
    status: 403,
    retryable: false,
    title: "The API key lacks the scope this operation needs",
  },
  ENVIRONMENT_MISMATCH: {
    status: 403,
    retryable: false,
    title: "A test key cannot act on live-held shared resources",
  },
  PLAN_ENTITLEMENT_REQUIRED: {
    status: 403,
    retryable: false,
    title: "The workspace plan lacks an entitlement",
  },
  LICENSE_REVOKED: { status: 403, retryable: false, title: "The license has been revoked" },
  LICENSE_EXPIRED: { status: 403, retryable: false, title: "The license has expired" },
  LICENSE_SUSPENDED: { status: 403, retryable: false, title: "The license is suspended" },
  SEALED_FILE_ENTITLEMENT_REQUIRED: {
    status: 403,
    retryable: false,
    title: "The file needs an entitlement the license lacks",
  },
  TWO_FACTOR_LOCKED: { status: 403, retryable: false, title: "Two-factor is locked for this user" },
  NAMED_USER_ASSIGNMENT_UNAVAILABLE: {
    status: 403,
    retryable: false,
    title: "The named-user assignment changed",
  },
  DEVICE_BLOCKED: { status: 403, retryable: false, title: "The vendor blocked this device" },
  LICENSE_BLOCKED: {
    status: 403,
    retryable: false,
    title: "The vendor blocked this license for runtime use",
  },
  TRIAL_ALREADY_USED: { status: 403, retryable: false, title: "A trial was already used" },
  TRIAL_ACTIVATION_INVALID: {
    status: 403,
    retryable: false,
    title: "The product does not accept trial sign-ups now",
  },
  NOT_FOUND: { status: 404, retryable: false, title: "No such resource or route" },
  IDEMPOTENCY_CONFLICT: {
    status: 409,
    retryable: false,
    title: "Idempotency-Key reused with another body, or still in flight",
  },
  VERSION_CONFLICT: { status: 409, retryable: false, title: "If-Match is stale; nothing was changed" },
  PRODUCT_ARCHIVED: { status: 409, retryable: false, title: "The product is archived" },
  PLAN_QUOTA_EXCEEDED: { status: 409, retryable: false, title: "A workspace allowance is used up" },
  MACHINE_LIMIT_REACHED: { status: 409, retryable: false, title: "The license has no free machine slot" },
  CONCURRENCY_LIMIT_REACHED: { status: 409, retryable: true, title: "No concurrent seat is free" },
  DEVICE_KEY_MISMATCH: { status: 409, retryable: false, title: "The device key does not match" },
  SIGNING_KEY_PENDING: {
    status: 409,
    retryable: true,
    title: "The product's signing keys are not ready yet",
  },
  OFFLINE_REQUEST_USED: {
    status: 409,
    retryable: false,
    title: "This offline request was used before; the device must generate a new one",
  },
  SEALED_FILES_UNAVAILABLE: {
    status: 409,
    retryable: false,
    title: "This environment does not offer sealed files",
  },
  EMAIL_VERIFICATION_EXPIRED: {
    status: 410,
    retryable: false,
    title: "The verification is expired, used or replaced",
  },
  ACTIVATION_DEACTIVATED: { status: 410, retryable: false, title: "The activation was deactivated" },
  LEASE_RELEASED: { status: 410, retryable: false, title: "The lease was released" },
  LICENSE_CLAIM_UNAVAILABLE: {
    status: 410,
    retryable: false,
    title: "The license claim is unknown, expired or already used",
  },
  PAYLOAD_TOO_LARGE: { status: 413, retryable: false, title: "The request body is over the route's limit" },
  VALIDATION_FAILED: { status: 422, retryable: false, title: "Invalid values; see details.errors" },
  INVALID_TRANSITION: { status: 422, retryable: false, title: "The resource cannot move to that state" },
  OFFLINE_ACTIVATION_REQUIRED: {
    status: 422,
    retryable: false,
    title: "The license is used only through offline packages",
  },
  OFFLINE_PACKAGE_NOT_ALLOWED: {
    status: 422,
    retryable: false,
    title: "The license's policy does not allow offline packages",
  },
  MACHINE_INFO_REQUIRED: {
    status: 422,
    retryable: false,
    title: "Send the full machine_info with this heartbeat",
  },
  LEASE_EXPIRED: { status: 422, retryable: false, title: "The lease expired; acquire a new one" },
  LEASE_INSTANCE_MISMATCH: { status: 422, retryable: false, title: "The lease belongs to another instance" },
  SEALED_FILE_INVALID: { status: 422, retryable: false, title: "The sealed file header cannot be used" },
  RATE_LIMITED: { status: 429, retryable: true, title: "Too many requests; see Retry-After" },
  INTERNAL_ERROR: { status: 500, retryable: true, title: "Unexpected server error" },
  SERVICE_UNAVAILABLE: { status: 503, retryable: true, title: "A required dependency is unavailable" },
  SEALED_FILES_KEY_UNAVAILABLE: {
    status: 503,
    retryable: true,
    title: "The sealing key is briefly unreachable",
  },
} as const satisfies Record<string, { status: number; retryable: boolean; title: string }>;

export type ErrorCode = keyof typeof ERROR_CODES;

export type ErrorDetails = Record<string, unknown>;

export interface SignedFor {
  productId: string;
  nonce: string;
  /**
   * Who a signed denial is for (protocol §16), written into its signed `error.details`: the
   * activation a device-proof call was made for, or the device key of an activation request.
   * The nonce alone does not bind a denial to its device: another device can send the same
   * nonce on its own activation and have its own denial signed for it.
   */
  subject?: { activation_id: string } | { device_thumbprint: string };
}

/** Field path -> messages, as carried by VALIDATION_FAILED in `details.errors`. */
export type FieldErrors = Record<string, string[]>;

/**
 * Field names come from clients, so the map has no prototype: a field called `constructor` or
 * `__proto__` is just a key.
 */
export const newFieldErrors = (): FieldErrors => Object.create(null) as FieldErrors;

export function addFieldError(errors: FieldErrors, field: string, message: string): void {
  const list = Object.hasOwn(errors, field) ? (errors[field] as string[]) : [];
  if (!list.includes(message)) list.push(message);
  errors[field] = list;
}

export class ApiError extends Error {
  readonly status: number;
  readonly retryable: boolean;

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: ErrorDetails = {},
    options: { retryable?: boolean; headers?: Record<string, string>; signedFor?: SignedFor } = {},
  ) {
    super(message);
    this.name = "ApiError";
    this.status = ERROR_CODES[code].status;
    this.retryable = options.retryable ?? ERROR_CODES[code].retryable;
    this.headers = options.headers ?? {};
    this.signedFor = options.signedFor;
  }

  readonly headers: Record<string, string>;
  /** Set on license-state denials: the error body is signed like a success for this product and nonce. */
  readonly signedFor: SignedFor | undefined;

  static validation(errors: FieldErrors, message = "Some values are invalid."): ApiError {
    return new ApiError("VALIDATION_FAILED", message, { errors });
  }

  static notFound(what: string): ApiError {
    return new ApiError("NOT_FOUND", `No ${what} with that id.`);
  }
}

/** Collects field errors across several checks so a caller hears about all of them at once. */
export class FieldErrorCollector {
  private readonly errors: FieldErrors = newFieldErrors();

  add(field: string, message: string): void {
    addFieldError(this.errors, field, message);
  }

  get empty(): boolean {
    return Object.keys(this.errors).length === 0;
  }

  throwIfAny(): void {
    if (!this.empty) throw ApiError.validation(this.errors);
  }
}
