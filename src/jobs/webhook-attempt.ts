import { isIP } from "node:net";
import type { Deps } from "../deps.ts";
import { type Clock, systemClock, unixSeconds } from "../domain/clock.ts";
import {
  AddressRefused,
  checkedAddresses,
  type Resolver,
  systemResolver,
} from "../modules/webhooks/address.ts";
import { bareHost, chatMessage, type DestinationKind } from "../modules/webhooks/destinations.ts";
import { previousSecretContext, secretContext, urlContext } from "../modules/webhooks/service.ts";
import { signatureHeaders } from "../modules/webhooks/signing.ts";

export const ATTEMPT_TIMEOUT_MS = 10_000;
/** Of a receiver's answer only this much is read (and thrown away): its status is what counts. */
const MAX_RESPONSE_BYTES = 64 * 1024;
const USER_AGENT = "licensing-webhooks/1";

/** What one attempt needs of a delivery, its event and its endpoint. */
export interface AttemptRow {
  endpoint_id: string;
  event_id: string;
  payload: string;
  kind: DestinationKind;
  url_ciphertext: string;
  secret_ciphertext: string | null;
  previous_secret_ciphertext: string | null;
  previous_secret_expires_at: number | null;
}

export type AttemptResult =
  | { outcome: "succeeded"; status: number }
  | { outcome: "failed"; status: number | null; error: string; gone?: boolean }
  /** `detail` (the address, the resolver's error) is for the server log only (address.ts says why). */
  | { outcome: "refused"; status: null; error: string; detail?: string };

export interface SenderOptions {
  allowPrivateNetworks: boolean;
  resolver?: Resolver;
  /** The `webhook-timestamp`: real time, as receivers check it against their own clock. */
  wallClock?: Clock;
  timeoutMs?: number;
  /** Tests only (DispatcherOptions says why). */
  connectOverride?: (url: URL) => string | undefined;
  /** Tests only (DispatcherOptions says why). */
  extraCa?: string;
}

/**
 * One delivery attempt over HTTP: the body (signed with Standard Webhooks, or a team-chat
 * message), the receiver's address checked and pinned against DNS rebinding, no redirects, a
 * timeout, and the outcome in words that never repeat the URL (a team-chat URL is a secret).
 * The dispatcher decides when to attempt; webhook-queue.ts records what came of it.
 */
export class WebhookSender {
  constructor(
    private readonly secrets: Deps["secrets"],
    private readonly options: SenderOptions,
  ) {}

  /**
   * The answer from the first of the checked addresses that takes the connection, in the
   * resolver's order, so a host whose first address cannot be reached (an IPv6 route that is
   * down) still gets its deliveries. Only a connection refused or unreachable moves on, when
   * nothing has been sent; a timeout or any answer does not.
   */
  private async firstConnected(
    targets: string[],
    deadline: AbortSignal,
    init: Parameters<typeof fetch>[1],
  ): Promise<Response> {
    for (let i = 0; ; i++) {
      try {
        return await fetch(targets[i] as string, init);
      } catch (error) {
        const code = (error as { code?: unknown }).code;
        const unreachable = typeof code === "string" && UNREACHABLE.has(code);
        if (!unreachable || deadline.aborted || i + 1 >= targets.length) throw error;
      }
    }
  }

  /** Secrets that sign now: the current one, and the previous one during a rotation's overlap. */
  private secretsOf(row: AttemptRow, now: Date): string[] {
    if (!row.secret_ciphertext) return [];
    const secrets = [this.secrets.decrypt(row.secret_ciphertext, secretContext(row.endpoint_id))];
    if (
      row.previous_secret_ciphertext &&
      row.previous_secret_expires_at !== null &&
      row.previous_secret_expires_at > now.getTime()
    ) {
      secrets.push(
        this.secrets.decrypt(row.previous_secret_ciphertext, previousSecretContext(row.endpoint_id)),
      );
    }
    return secrets;
  }

  /** Sends `row`'s event once and says how it went (a refused address or a failed connection is an outcome). */
  async send(row: AttemptRow, now: Date): Promise<AttemptResult> {
    // One deadline for the whole attempt (resolving, connecting, the answer and its body), so an
    // attempt never outlives its claim (the dispatcher derives the claim from this timeout).
    const timeoutMs = this.options.timeoutMs ?? ATTEMPT_TIMEOUT_MS;
    const deadline = AbortSignal.timeout(timeoutMs);
    const timedOut: AttemptResult = {
      outcome: "failed",
      status: null,
      error: `no answer within ${timeoutMs} ms`,
    };
    const url = new URL(this.secrets.decrypt(row.url_ciphertext, urlContext(row.endpoint_id)));
    const headers: Record<string, string> = { "content-type": "application/json", "user-agent": USER_AGENT };
    let body = row.payload;
    if (row.kind === "standard") {
      Object.assign(
        headers,
        signatureHeaders(
          this.secretsOf(row, now),
          row.event_id,
          unixSeconds((this.options.wallClock ?? systemClock).now()),
          body,
        ),
      );
    } else {
      body = JSON.stringify(chatMessage(row.kind, JSON.parse(row.payload)));
    }
    let targets: string[];
    let tls: { serverName: string } | undefined;
    const override = this.options.connectOverride?.(url);
    if (override !== undefined) {
      targets = [`${override}${url.pathname}${url.search}`];
    } else {
      let addresses: string[];
      try {
        addresses = await beforeDeadline(
          checkedAddresses(
            bareHost(url),
            this.options.resolver ?? systemResolver,
            this.options.allowPrivateNetworks,
          ),
          deadline,
        );
      } catch (error) {
        if (error instanceof AddressRefused)
          return { outcome: "refused", status: null, error: error.message, detail: error.detail };
        if (deadline.aborted) return timedOut;
        throw error;
      }
      // Connect to the addresses just checked, so a second DNS answer cannot swap in another one
      // (DNS rebinding). The name still goes out as Host and, for https, as the TLS server name
      // the certificate is verified against.
      targets = addresses.map((address) => {
        const pinned = new URL(url.href);
        pinned.hostname = address.includes(":") ? `[${address}]` : address;
        return pinned.href;
      });
      headers.host = url.host;
      const host = bareHost(url);
      if (url.protocol === "https:" && !isIP(host)) tls = { serverName: host };
    }
    // The rule create and update apply (destinations.ts), applied again at every attempt: an http
    // endpoint made while the operator allowed it gets nothing once that is turned off. After the
    // address check, so a private address is refused as such.
    if (url.protocol === "http:" && !this.options.allowPrivateNetworks) {
      return {
        outcome: "refused",
        status: null,
        error: "http is allowed only while the operator allows private networks; the URL must use https",
      };
    }
    try {
      const response = await this.firstConnected(targets, deadline, {
        method: "POST",
        headers,
        body,
        redirect: "manual",
        signal: deadline,
        ...(tls || this.options.extraCa
          ? { tls: { ...tls, ...(this.options.extraCa ? { ca: this.options.extraCa } : {}) } }
          : {}),
      });
      // The status decides. The body is read (up to 64 KiB) only to leave the connection clean: a
      // receiver that answered 2xx and is slow to send the rest has still answered, and counting
      // it as a timeout would deliver the event again.
      await drain(response).catch(() => {});
      if (response.status >= 200 && response.status <= 299)
        return { outcome: "succeeded", status: response.status };
      if (response.status === 410)
        return {
          outcome: "failed",
          status: 410,
          error: "the receiver answered 410 Gone; the endpoint is disabled",
          gone: true,
        };
      if (response.status >= 300 && response.status <= 399)
        return { outcome: "failed", status: response.status, error: "redirect not followed" };
      return { outcome: "failed", status: response.status, error: `HTTP ${response.status}` };
    } catch (error) {
      const err = error as Error;
      if (deadline.aborted || err.name === "TimeoutError" || err.name === "AbortError") return timedOut;
      // The message never includes the URL: a team-chat URL is a secret and this text is shown and logged.
      return { outcome: "failed", status: null, error: connectionError(err) };
    }
  }
}

/**
 * `work`, or the deadline's reason once it passes first. A DNS lookup cannot be cancelled; it is
 * left to finish on its own and its answer ignored.
 */
function beforeDeadline<T>(work: Promise<T>, deadline: AbortSignal): Promise<T> {
  if (deadline.aborted) return Promise.reject(deadline.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(deadline.reason);
    deadline.addEventListener("abort", onAbort, { once: true });
    work.then(
      (value) => {
        deadline.removeEventListener("abort", onAbort);
        resolve(value);
      },
      (error: unknown) => {
        deadline.removeEventListener("abort", onAbort);
        reject(error);
      },
    );
  });
}

async function drain(response: Response): Promise<void> {
  const reader = response.body?.getReader();
  if (!reader) return;
  let read = 0;
  try {
    while (read < MAX_RESPONSE_BYTES) {
      const { done, value } = await reader.read();
      if (done) return;
      read += value.byteLength;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}

/** Connection errors after which nothing was sent, so the next address may be tried. */
const UNREACHABLE = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL"]);

/** A connection failure in words that never repeat the URL (Bun's messages can include it). */
function connectionError(error: Error): string {
  const code = (error as { code?: string }).code;
  if (code) return `connection failed (${code})`;
  return "connection failed";
}
