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

  respond(request: Request, status: number, data: unknown, signedFor: SignedFor, at?: Date): Response {
    const requestId = requestState.get(request)?.requestId ?? "req_unknown";
    const now = at ?? this.clock.now();
    const text = signedResponseText(this.trust.onlineSigner(signedFor.productId, now), {
      requestId,
      nonce: signedFor.nonce,
      serverTime: unixSeconds(now),
      status,
      body: data,
    });
    return new Response(text, { status, headers: { "content-type": "application/json" } });
  }
}
