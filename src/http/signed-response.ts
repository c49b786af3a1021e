import { type EnvelopeSignature, signedResponseText, signResponse } from "../crypto/envelope.ts";
import type { Clock } from "../domain/clock.ts";
import { unixSeconds } from "../domain/clock.ts";
import type { TrustService } from "../modules/trust/service.ts";
import type { SignedFor } from "./errors.ts";
import { requestState } from "./request-state.ts";

/** Builds signed runtime responses (DESIGN §5): data plus assertion, signature and delegation. */
export class RuntimeSigner {
  constructor(
    private readonly trust: TrustService,
    private readonly clock: Clock,
  ) {}

  /** `at` pins the signed server_time when the data already states the time (the time route). */
  signature(
    signedFor: SignedFor,
    requestId: string,
    status: number,
    body: unknown,
    at?: Date,
  ): EnvelopeSignature {
    const now = at ?? this.clock.now();
    return signResponse(this.trust.onlineSigner(signedFor.productId, now), {
      requestId,
      nonce: signedFor.nonce,
      serverTime: unixSeconds(now),
      status,
      body,
    });
  }

  /**
   * The signed answer as a Response that already carries the headers the hooks put in `set`
   * (request id, rate limits, CORS). Elysia would otherwise copy a returned Response and those
   * headers into a new Headers and a second Response on every call; with `set.headers` handed
   * over here and left empty, it returns this one as it is.
   */
  respond(
    { request, set }: { request: Request; set: { headers: Record<string, string | number> } },
    status: number,
    data: unknown,
    signedFor: SignedFor,
    at?: Date,
  ): Response {
    const requestId = requestState.get(request)?.requestId ?? "req_unknown";
    const now = at ?? this.clock.now();
    const text = signedResponseText(this.trust.onlineSigner(signedFor.productId, now), {
      requestId,
      nonce: signedFor.nonce,
      serverTime: unixSeconds(now),
      status,
      body: data,
    });
    const headers = set.headers;
    headers["content-type"] = "application/json";
    set.headers = {};
    // Header values are strings or numbers (rate limits); Response writes numbers as text.
    return new Response(text, { status, headers: headers as Record<string, string> });
  }
}
