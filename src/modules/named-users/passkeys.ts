import { randomBytes } from "node:crypto";
import { isIP } from "node:net";
import { count, eq, isNotNull, lte, or, sql } from "drizzle-orm";
import { type RelyingParty, verifyRegistration, WebAuthnError } from "../../crypto/webauthn.ts";
import type { ChangeContext, Deps } from "../../deps.ts";
import type { PlanDefinition } from "../../domain/plans.ts";
import { ApiError } from "../../http/errors.ts";
import type { Db } from "../../store/db.ts";
import { licenseUsers, passkeyRegistrations, passkeys, policies } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import { PasskeyApprovals } from "./passkey-approvals.ts";
import type { NamedUserService } from "./service.ts";

/** How long a vendor's registration link works. */
export const REGISTRATION_LINK_TTL_SEC = 24 * 3600;
const MAX_PASSKEYS = 10;

type Writer = Pick<Db, "select" | "insert" | "update" | "delete">;

const b64u = (text: string): Uint8Array => new Uint8Array(Buffer.from(text, "base64url"));
const linkGone = () =>
  new ApiError("NOT_FOUND", "This passkey registration link is unknown, used or expired.");
/** Why browsers will not use passkeys at a base URL (passkeyBaseUrlProblem). */
export interface PasskeyBaseUrlProblem {
  reason: "base_url_host_is_ip_address" | "base_url_not_secure";
  message: string;
}

/**
 * Why browsers will not use passkeys of a relying party at this base URL, or null when they will.
 * The RP ID is the base URL's host, and WebAuthn refuses an IP address as an RP ID in every
 * browser (the default base URL, http://127.0.0.1:PORT, is one); it also runs only in a secure
 * context: HTTPS, or plain HTTP on localhost.
 */
export function passkeyBaseUrlProblem(baseUrl: string): PasskeyBaseUrlProblem | null {
  const url = new URL(baseUrl);
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  if (isIP(host) !== 0) {
    return {
      reason: "base_url_host_is_ip_address",
      message: `its host ${url.hostname} is an IP address, which browsers never accept for passkeys: set --base-url (or LICENSING_BASE_URL) to a URL whose host is a domain name, such as https://licensing.example.com, or http://localhost:${url.port || 80} on this machine`,
    };
  }
  if (url.protocol !== "https:" && host !== "localhost" && !host.endsWith(".localhost")) {
    return {
      reason: "base_url_not_secure",
      message: `it is plain ${url.protocol.slice(0, -1)} on ${url.hostname}, and browsers offer passkeys only on https:// pages (or on localhost): set --base-url (or LICENSING_BASE_URL) to the https:// URL users reach`,
    };
  }
  return null;
}

/**
 * Whether this store may need passkeys: a named-user policy, or a passkey already registered.
 * Two small reads, for the server's start to tell a base URL that breaks something in
 * use from one that only would (every default install has the IP-address base URL).
 */
export function passkeysMayBeUsed(db: Pick<Db, "select">): boolean {
  const namedUserPolicy = db
    .select({ id: policies.id })
    .from(policies)
    .where(eq(policies.identityMode, "named_user"))
    .limit(1)
    .get();
  return (
    namedUserPolicy !== undefined ||
    db.select({ id: passkeys.id }).from(passkeys).limit(1).get() !== undefined
  );
}

export interface RegistrationBody {
  token: string;
  credential_id: string;
  client_data_json: string;
  attestation_object: string;
}

/**
 * Passkeys of license users (spec §4.2 rule 7): a vendor sends a single-use registration link;
 * later, each verification email of such a user carries an approval link, valid for that
 * verification only; a WebAuthn assertion there yields an eight-digit approval code, which the
 * app sends as `second_factor_code`, once. The relying party is the service's base URL.
 */
export class PasskeyService {
  readonly rp: RelyingParty;
  /** The approval links of verification mails, and their codes (passkey-approvals.ts). */
  readonly approvals: PasskeyApprovals;

  constructor(
    private readonly deps: Deps,
    private readonly users: NamedUserService,
    private readonly baseUrl: string,
    plan: () => PlanDefinition,
  ) {
    const url = new URL(baseUrl);
    this.rp = { id: url.hostname, origin: url.origin };
    this.approvals = new PasskeyApprovals(deps, this.rp, baseUrl, plan);
  }

  count(userId: string): number {
    return (
      this.deps.db.select({ n: count() }).from(passkeys).where(eq(passkeys.userId, userId)).get()?.n ?? 0
    );
  }

  registrationLink(userId: string, ctx: ChangeContext) {
    const user = this.users.get(userId, ctx.environment);
    // A link on an IP address could never register anything: the vendor is told so, not the
    // user later. Plain http on another host is only warned about at start: a browser can be told
    // to treat such an origin as secure (test set-ups do).
    const problem = passkeyBaseUrlProblem(this.baseUrl);
    if (problem?.reason === "base_url_host_is_ip_address") {
      throw new ApiError(
        "INVALID_TRANSITION",
        `Passkeys cannot work with this service's base URL ${this.baseUrl}: ${problem.message}.`,
        { reason: problem.reason, base_url: this.baseUrl },
      );
    }
    if (user.status !== "active")
      throw new ApiError("INVALID_TRANSITION", "The user is disabled.", { from: "disabled" });
    const token = randomBytes(32).toString("base64url");
    const now = this.deps.clock.now();
    const expiresAt = new Date(now.getTime() + REGISTRATION_LINK_TTL_SEC * 1000);
    this.deps.db.transaction((tx) => {
      // One live link per user: a vendor sends a new one when the last went astray, and the
      // lost one must stop working then, not a day later.
      const linksEnded = endRegistrationLinks(tx, userId, now);
      tx.insert(passkeyRegistrations)
        .values({
          tokenHash: this.hash(token, "passkey-registration"),
          userId,
          expiresAt,
          challenge: null,
          usedAt: null,
        })
        .run();
      recordAudit(tx, this.deps, ctx, {
        type: "license_user.passkey_link_created",
        target: { type: "license_user", id: userId },
        data: { links_ended: linksEnded },
      });
    });
    return { url: `${this.baseUrl}/passkeys/v1/register#${token}`, expires_at: expiresAt.toISOString() };
  }

  registrationOptions(token: string) {
    return this.deps.db.transaction((tx) => {
      const link = this.openLink(tx, token);
      const user = tx.select().from(licenseUsers).where(eq(licenseUsers.id, link.userId)).get();
      if (user?.status !== "active") throw linkGone();
      const challenge = randomBytes(32).toString("base64url");
      tx.update(passkeyRegistrations)
        .set({ challenge })
        .where(eq(passkeyRegistrations.tokenHash, link.tokenHash))
        .run();
      const existing = tx
        .select({ id: passkeys.credentialId })
        .from(passkeys)
        .where(eq(passkeys.userId, user.id))
        .all();
      return {
        challenge,
        rp_id: this.rp.id,
        user_id: user.id,
        user_name: user.email,
        exclude_credentials: existing.map((row) => row.id),
      };
    });
  }

  /** `requestId` ties the audit event to the request: the user acts through the vendor's link, with no API key. */
  register(body: RegistrationBody, requestId: string | null) {
    return this.deps.db.transaction((tx) => {
      const link = this.openLink(tx, body.token);
      if (!link.challenge) throw new ApiError("INVALID_REQUEST", "Ask for registration options first.");
      // Asked again, not trusted from the options call: the vendor may have disabled the user since.
      const user = tx.select().from(licenseUsers).where(eq(licenseUsers.id, link.userId)).get();
      if (user?.status !== "active") throw linkGone();
      let verified: ReturnType<typeof verifyRegistration>;
      try {
        verified = verifyRegistration({
          credentialId: b64u(body.credential_id),
          clientDataJson: b64u(body.client_data_json),
          attestationObject: b64u(body.attestation_object),
          challenge: link.challenge,
          rp: this.rp,
        });
      } catch (error) {
        if (error instanceof WebAuthnError)
          throw ApiError.validation({ attestation_object: [error.message] });
        throw error;
      }
      if (this.count(link.userId) >= MAX_PASSKEYS) {
        throw new ApiError("INVALID_TRANSITION", `A user has at most ${MAX_PASSKEYS} passkeys.`, {
          max: MAX_PASSKEYS,
        });
      }
      const taken = tx
        .select({ id: passkeys.id })
        .from(passkeys)
        .where(eq(passkeys.credentialId, body.credential_id))
        .get();
      if (taken) throw ApiError.validation({ credential_id: ["this passkey is registered already"] });
      const now = this.deps.clock.now();
      const id = `psk_${this.deps.ids.ulid(now.getTime())}`;
      tx.insert(passkeys)
        .values({
          id,
          userId: link.userId,
          credentialId: body.credential_id,
          publicKey: verified.key,
          signCount: verified.signCount,
          createdAt: now,
          lastUsedAt: null,
        })
        .run();
      tx.update(passkeyRegistrations)
        .set({ usedAt: now, challenge: null })
        .where(eq(passkeyRegistrations.tokenHash, link.tokenHash))
        .run();
      // The user object shows its passkey count: an If-Match read before this must go stale.
      bumpRevision(tx, link.userId, now);
      // A new second factor, like the vendor's two-factor changes; the user made it, not an API key.
      recordAudit(
        tx,
        this.deps,
        { actor: { type: "license_user", id: user.id }, environment: user.environment, requestId },
        {
          type: "license_user.passkey_registered",
          target: { type: "license_user", id: user.id },
          data: { passkey_id: id },
        },
      );
      return { passkey_id: id, user_id: link.userId, created_at: now.toISOString() };
    });
  }

  /**
   * Deletes registration links that can no longer be used (spent, or past their 24 hours): each
   * `registrationLink` call writes one, so without this the table would only grow. An ended
   * link and a missing one answer the same 410. Returns how many went.
   */
  purgeLinks(): number {
    return this.deps.db
      .delete(passkeyRegistrations)
      .where(
        or(
          isNotNull(passkeyRegistrations.usedAt),
          lte(passkeyRegistrations.expiresAt, this.deps.clock.now()),
        ),
      )
      .returning({ tokenHash: passkeyRegistrations.tokenHash })
      .all().length;
  }

  deleteAll(tx: Writer, userId: string): void {
    tx.delete(passkeys).where(eq(passkeys.userId, userId)).run();
  }

  private hash(secret: string, purpose: string): string {
    return this.deps.secrets.lookupHash(secret, purpose);
  }

  private openLink(tx: Writer, token: string) {
    const link = tx
      .select()
      .from(passkeyRegistrations)
      .where(eq(passkeyRegistrations.tokenHash, this.hash(token, "passkey-registration")))
      .get();
    if (!link || link.usedAt !== null || link.expiresAt.getTime() <= this.deps.clock.now().getTime())
      throw linkGone();
    return link;
  }
}

/**
 * Ends every registration link the user was sent, with its options' challenge: called when the
 * vendor turns two-factor off, changes the user's address (a mailbox lost or taken over) or
 * disables the user, none of which a link sent before may undo by registering a passkey later,
 * and when the vendor makes a new link.
 */
export function endRegistrationLinks(tx: Pick<Db, "delete">, userId: string, now: Date): number {
  // Every row goes; only links that still worked count as something ended (used and expired ones
  // wait for the sweeper's purge, and ending them changes nothing the vendor could see).
  return tx
    .delete(passkeyRegistrations)
    .where(eq(passkeyRegistrations.userId, userId))
    .returning({ usedAt: passkeyRegistrations.usedAt, expiresAt: passkeyRegistrations.expiresAt })
    .all()
    .filter((link) => link.usedAt === null && link.expiresAt.getTime() > now.getTime()).length;
}

/**
 * A write the user object shows (passkeys, recovery codes left, the lock) made outside the
 * vendor's own changes: the user's ETag moves, so an If-Match read before it is stale.
 */
export function bumpRevision(tx: Pick<Db, "update">, userId: string, now: Date): void {
  tx.update(licenseUsers)
    .set({ revision: sql`${licenseUsers.revision} + 1`, updatedAt: now })
    .where(eq(licenseUsers.id, userId))
    .run();
}
