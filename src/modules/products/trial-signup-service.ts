import { and, count, eq, gt } from "drizzle-orm";
import type { ChangeContext, Deps } from "../../deps.ts";
import { hasFeature, type PlanDefinition } from "../../domain/plans.ts";
import type { Environment } from "../../domain/scopes.ts";
import { ApiError, FieldErrorCollector } from "../../http/errors.ts";
import { assertIfMatch, type IfMatch, versionEtag } from "../../http/preconditions.ts";
import { bodyReference } from "../../http/references.ts";
import type { Db } from "../../store/db.ts";
import { products, trialGrants, trialSignups } from "../../store/schema/index.ts";
import { recordAudit } from "../events/service.ts";
import type { PolicyRow, PolicyService } from "../policies/service.ts";
import { archived, type ProductRow, type ProductService } from "./service.ts";
import type { TrialSignupPatchBody } from "./trial-signup-model.ts";

export const DEFAULT_DAILY_LIMIT = 100;
export const MAX_DAILY_LIMIT = 100_000;
const DAY_MS = 86_400_000;

/**
 * Why a product does or does not accept trial sign-ups now. `accepting` is the spec's value; the
 * others are ours (spec §3.3 leaves them open) and double as TRIAL_ACTIVATION_INVALID's
 * `details.reason`, except `not_entitled`, which the runtime answers with PLAN_ENTITLEMENT_REQUIRED.
 */
export type TrialSignupStatus =
  | "accepting"
  | "disabled"
  | "not_entitled"
  | "policy_unavailable"
  | "limit_reached"
  | "product_archived";

export interface TrialSignupState {
  productId: string;
  policyId: string | null;
  dailyLimit: number;
  startedLast24Hours: number;
  status: TrialSignupStatus;
  /** The chosen policy while it can still issue trials. */
  policy: TrialPolicyFields | null;
}

export type TrialPolicyFields = Pick<
  PolicyRow,
  "id" | "productId" | "licenseType" | "status" | "identityMode" | "validationMode" | "perpetualMode"
>;

/** A policy a sign-up can issue: an active device-identity trial policy that is used online. */
export function trialPolicyProblems(policy: TrialPolicyFields, productId: string): string[] {
  const problems: string[] = [];
  if (policy.productId !== productId) problems.push("belongs to another product");
  if (policy.licenseType !== "trial") problems.push("must be a trial policy (license_type trial)");
  if (policy.status !== "active") problems.push("is retired; choose an active trial policy");
  if (policy.identityMode !== "device") problems.push("must use identity_mode device");
  if (policy.validationMode === "offline" || policy.perpetualMode === "unmanaged")
    problems.push("must be usable online (not offline-only)");
  return problems;
}

/**
 * Trial sign-up settings of a product (spec §4.3 rule 3). They share the product's `version` as
 * their concurrency token: a change bumps it, and If-Match compares against it.
 */
export class TrialSignupService {
  /**
   * The settings and the chosen policy in one row of one shape, nulls where there are none: read
   * apart through the ORM, a missing row cost less to materialise than a found one, and a start
   * for a product without a trial policy answered 0.02-0.04 ms sooner than a sending one
   * (test/bench/verification-timing.ts). Plain columns, the same work whatever they hold.
   */
  private readonly signupRow;

  constructor(
    private readonly deps: Deps,
    private readonly products: ProductService,
    private readonly policies: PolicyService,
    private readonly plan: () => PlanDefinition,
  ) {
    this.signupRow = deps.sqlite.prepare<SignupRow, [string]>(
      `SELECT s.policy_id AS signupPolicyId, s.daily_limit AS dailyLimit, p.id AS id,
              p.product_id AS productId, p.license_type AS licenseType, p.status AS status,
              p.identity_mode AS identityMode, p.validation_mode AS validationMode,
              p.perpetual_mode AS perpetualMode
       FROM products x LEFT JOIN trial_signups s ON s.product_id = x.id
         LEFT JOIN policies p ON p.id = s.policy_id
       WHERE x.id = ?`,
    );
  }

  /** GET: 404 for another environment's product, 409 for an archived one. */
  get(productId: string, environment: Environment) {
    const product = this.products.getActive(productId, environment);
    return present(this.state(product, this.deps.clock.now()), product.version);
  }

  update(productId: string, body: TrialSignupPatchBody, ifMatch: IfMatch | undefined, ctx: ChangeContext) {
    return this.deps.db.transaction((tx) => {
      const product = this.products.get(productId, ctx.environment);
      assertIfMatch(ifMatch, versionEtag(product.version));
      if (product.status === "archived") throw archived(product.id);
      const current = this.stored(product.id);
      const changes: string[] = [];
      let policyId = current.policyId;
      if (body.policy_id !== undefined && body.policy_id !== current.policyId) {
        if (body.policy_id !== null) {
          // Choosing or replacing a policy needs the entitlement; clearing it never does.
          if (!hasFeature(this.plan(), "trial_licenses")) throw planLacksTrials();
          const errors = new FieldErrorCollector();
          const policy = bodyReference(
            () => this.policies.get(body.policy_id as string, ctx.environment),
            "policy_id",
            errors,
          );
          for (const problem of policy ? trialPolicyProblems(policy, product.id) : [])
            errors.add("policy_id", problem);
          errors.throwIfAny();
        }
        policyId = body.policy_id;
        changes.push("policy_id");
      }
      let dailyLimit = current.dailyLimit;
      if (body.daily_limit !== undefined && body.daily_limit !== current.dailyLimit) {
        dailyLimit = body.daily_limit;
        changes.push("daily_limit");
      }
      const now = this.deps.clock.now();
      if (changes.length === 0) return present(this.state(product, now), product.version);
      tx.insert(trialSignups)
        .values({ productId: product.id, policyId, dailyLimit, updatedAt: now })
        .onConflictDoUpdate({ target: trialSignups.productId, set: { policyId, dailyLimit, updatedAt: now } })
        .run();
      const version = product.version + 1;
      tx.update(products).set({ version, updatedAt: now }).where(eq(products.id, product.id)).run();
      recordAudit(tx, this.deps, ctx, {
        type: "product.updated",
        target: { type: "product", id: product.id },
        data: {
          changes: changes.map((field) => `trial_signup.${field}`),
          trial_signup: { policy_id: policyId, daily_limit: dailyLimit },
        },
      });
      return present(this.state({ ...product, version }, now), version);
    });
  }

  /** Whether the product accepts a sign-up now, and with which policy; for the runtime routes. */
  state(product: ProductRow, now: Date, reader: Pick<Db, "select"> = this.deps.db): TrialSignupState {
    // Every read and check happens whatever the outcome: the runtime start answers the same, in
    // the same time, whether or not it sends. The row is read on the same connection as `reader`,
    // so inside the caller's transaction.
    const { signupPolicyId, dailyLimit, ...policy } = this.signupRow.get(product.id) ?? EMPTY_SIGNUP_ROW;
    const stored = { policyId: signupPolicyId, dailyLimit: dailyLimit ?? DEFAULT_DAILY_LIMIT };
    const started = this.startedSince(product.id, new Date(now.getTime() - DAY_MS), reader);
    const entitled = hasFeature(this.plan(), "trial_licenses");
    // Checked on the nulls too (it then finds problems), so the work does not depend on a policy.
    const problems = trialPolicyProblems(policy as TrialPolicyFields, product.id);
    const usable = policy.id !== null && problems.length === 0 ? (policy as TrialPolicyFields) : null;
    let status: TrialSignupStatus = "accepting";
    if (product.status === "archived") status = "product_archived";
    else if (stored.policyId === null) status = "disabled";
    else if (!entitled) status = "not_entitled";
    else if (!usable) status = "policy_unavailable";
    else if (started >= stored.dailyLimit) status = "limit_reached";
    return {
      productId: product.id,
      policyId: stored.policyId,
      dailyLimit: stored.dailyLimit,
      startedLast24Hours: started,
      status,
      policy: usable,
    };
  }

  private stored(productId: string, reader: Pick<Db, "select"> = this.deps.db) {
    const row = reader.select().from(trialSignups).where(eq(trialSignups.productId, productId)).get();
    return { policyId: row?.policyId ?? null, dailyLimit: row?.dailyLimit ?? DEFAULT_DAILY_LIMIT };
  }

  /** New trial licenses (not devices joining one) made by sign-up since `since`. */
  private startedSince(productId: string, since: Date, reader: Pick<Db, "select">): number {
    return (
      reader
        .select({ n: count() })
        .from(trialGrants)
        .where(
          and(
            eq(trialGrants.productId, productId),
            eq(trialGrants.kind, "started"),
            gt(trialGrants.createdAt, since),
          ),
        )
        .get()?.n ?? 0
    );
  }
}

/** `signupRow`'s columns: each null when the product has no settings or no chosen policy. */
type SignupRow = { signupPolicyId: string | null; dailyLimit: number | null } & {
  [K in keyof TrialPolicyFields]: TrialPolicyFields[K] | null;
};
const EMPTY_SIGNUP_ROW: SignupRow = {
  signupPolicyId: null,
  dailyLimit: null,
  id: null,
  productId: null,
  licenseType: null,
  status: null,
  identityMode: null,
  validationMode: null,
  perpetualMode: null,
};

function present(state: TrialSignupState, version: number) {
  return {
    product_id: state.productId,
    policy_id: state.policyId,
    daily_limit: state.dailyLimit,
    status: state.status,
    started_last_24_hours: state.startedLast24Hours,
    version,
  };
}

export const planLacksTrials = () =>
  new ApiError("PLAN_ENTITLEMENT_REQUIRED", "The workspace plan does not include trial licenses.", {
    entitlement: "trial_licenses",
  });
