import { Elysia } from "elysia";
import { managementAuth } from "../../http/auth.ts";
import { changeContext } from "../../http/context.ts";
import { postOnce } from "../../http/idempotency.ts";
import { parseIfMatch } from "../../http/preconditions.ts";
import { noContent } from "../../http/respond.ts";
import {
  errorEnvelopeResponse,
  IdempotencyHeaders,
  IfMatchHeaders,
  NoEtagIfMatchHeaders,
  WithEtag,
} from "../../http/schemas.ts";
import type { Services } from "../../services.ts";
import { presentAssignment } from "./assignments.ts";
import { AssignmentListQuery, LicenseUserListQuery, namedUserModels } from "./model.ts";
import { passkeysController } from "./passkey-routes.ts";
import { licenseUserEtag } from "./service.ts";

const USERS = "/mgmt/v1/license-users";

/**
 * Named users (spec §4.2 rules 6-8): license users, their assignments to named-user licenses and
 * their TOTP two-factor. Scopes: licenses:read to read, licenses:write to change.
 */
export const namedUsersController = (services: Services) =>
  new Elysia().use(managementRoutes(services)).use(passkeysController(services));

const managementRoutes = ({ namedUsers, twoFactor, passkeys, licenses, idempotency, pages }: Services) =>
  new Elysia({ prefix: "/mgmt/v1", detail: { tags: ["Named users"] } })
    .use(managementAuth)
    .model(namedUserModels)
    .get(
      "/license-users",
      ({ caller, query }) => {
        const page = pages.newestFirst(query, {
          route: USERS,
          idPrefix: "usr",
          environment: caller.environment,
          filters: { email: query.email, status: query.status },
        });
        const rows = namedUsers.list(caller.environment, page, { email: query.email, status: query.status });
        const { rows: shown, pagination } = page.split(rows);
        return { data: namedUsers.presentAll(shown), pagination };
      },
      {
        scope: "licenses:read",
        query: LicenseUserListQuery,
        response: { 200: "license_user.list" },
        detail: { summary: "List license users, newest first" },
      },
    )
    .post(
      "/license-users",
      ({ caller, body, headers, request }) =>
        postOnce(
          idempotency,
          USERS,
          { caller, headers, body },
          () => {
            const row = namedUsers.create(body, changeContext(caller, request));
            return {
              status: 201,
              body: { data: namedUsers.present(row) },
              headers: { etag: licenseUserEtag(row) },
            };
          },
          { required: false },
        ),
      {
        scope: "licenses:write",
        body: "license_user.create",
        headers: IdempotencyHeaders,
        response: { 201: "license_user.response" },
        detail: {
          summary: "Create a local-ID license user (unique active email per environment)",
          responses: { 201: WithEtag },
        },
      },
    )
    .get(
      "/license-users/:id",
      ({ caller, params, set }) => {
        const row = namedUsers.get(params.id, caller.environment);
        set.headers.etag = licenseUserEtag(row);
        return { data: namedUsers.present(row) };
      },
      {
        scope: "licenses:read",
        response: { 200: "license_user.response" },
        detail: { summary: "Get a license user (ETag)", responses: { 200: WithEtag } },
      },
    )
    .patch(
      "/license-users/:id",
      ({ caller, params, body, headers, request, set }) => {
        const row = namedUsers.update(
          params.id,
          body,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = licenseUserEtag(row);
        return { data: namedUsers.present(row) };
      },
      {
        scope: "licenses:write",
        body: "license_user.update",
        headers: IfMatchHeaders,
        response: { 200: "license_user.response" },
        detail: { summary: "Update a license user (If-Match: the ETag)", responses: { 200: WithEtag } },
      },
    )
    .delete(
      "/license-users/:id",
      ({ caller, params, headers, request }) => {
        namedUsers.disable(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "licenses:write",
        headers: IfMatchHeaders,
        detail: { summary: "Disable a license user (If-Match: the ETag)" },
      },
    )
    .get(
      "/license-users/:id/assignments",
      ({ caller, params, query }) => {
        namedUsers.get(params.id, caller.environment);
        const page = pages.newestFirst(query, {
          route: `${USERS}/:id/assignments`,
          idPrefix: "asg",
          environment: caller.environment,
          filters: { id: params.id, status: query.status },
        });
        return page.present(
          namedUsers.assignments.list({ userId: params.id }, page, query.status),
          presentAssignment,
        );
      },
      {
        scope: "licenses:read",
        query: AssignmentListQuery,
        response: { 200: "assignment.list" },
        detail: { summary: "A user's license assignments, newest first" },
      },
    )
    .get(
      "/licenses/:id/assignments",
      ({ caller, params, query }) => {
        licenses.get(params.id, caller.environment);
        const page = pages.newestFirst(query, {
          route: "/mgmt/v1/licenses/:id/assignments",
          idPrefix: "asg",
          environment: caller.environment,
          filters: { id: params.id, status: query.status },
        });
        return page.present(
          namedUsers.assignments.list({ licenseId: params.id }, page, query.status),
          presentAssignment,
        );
      },
      {
        scope: "licenses:read",
        query: AssignmentListQuery,
        response: { 200: "assignment.list" },
        detail: { summary: "Users assigned to a license, newest first" },
      },
    )
    .post(
      "/licenses/:id/assignments",
      ({ caller, params, body, headers, request }) =>
        postOnce(
          idempotency,
          "/mgmt/v1/licenses/:id/assignments",
          { caller, headers, body: { license_id: params.id, ...body } },
          () => ({
            status: 201,
            body: {
              data: presentAssignment(
                namedUsers.assignments.assign(params.id, body.user_id, changeContext(caller, request)),
              ),
            },
          }),
          { required: false },
        ),
      {
        scope: "licenses:write",
        body: "assignment.create",
        headers: IdempotencyHeaders,
        response: { 201: "assignment.response" },
        detail: { summary: "Assign a user to a named-user license" },
      },
    )
    .delete(
      "/license-assignments/:id",
      ({ caller, params, headers, request }) => {
        namedUsers.assignments.unassign(
          params.id,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        return noContent();
      },
      {
        scope: "licenses:write",
        headers: NoEtagIfMatchHeaders,
        detail: { summary: "Remove a license assignment" },
      },
    )
    .post(
      "/license-users/:id/two-factor/totp",
      ({ caller, params, headers, request, set }) => {
        const enrolment = twoFactor.enrol(
          params.id,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.status = 201;
        set.headers["cache-control"] = "no-store";
        return { data: enrolment };
      },
      {
        scope: "licenses:write",
        headers: IfMatchHeaders,
        response: { 201: "two_factor.enrolment" },
        detail: {
          summary: "Enrol TOTP: the otpauth:// URI and ten recovery codes, shown once",
          responses: {
            422: errorEnvelopeResponse(
              "INVALID_TRANSITION: the user is disabled, or two-factor is already on (details.from).",
            ),
          },
        },
      },
    )
    .post(
      "/license-users/:id/two-factor/totp/confirm",
      ({ caller, params, body, headers, request, set }) => {
        const row = twoFactor.confirm(
          params.id,
          body.code,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = licenseUserEtag(row);
        return { data: namedUsers.present(row) };
      },
      {
        scope: "licenses:write",
        body: "two_factor.confirm",
        headers: IfMatchHeaders,
        response: { 200: "license_user.response" },
        detail: { summary: "Turn TOTP on with a code from the authenticator", responses: { 200: WithEtag } },
      },
    )
    .delete(
      "/license-users/:id/two-factor",
      ({ caller, params, headers, request }) => {
        twoFactor.disable(params.id, parseIfMatch(headers["if-match"]), changeContext(caller, request));
        return noContent();
      },
      {
        scope: "licenses:write",
        headers: IfMatchHeaders,
        detail: { summary: "Turn two-factor off (secret and recovery codes deleted)" },
      },
    )
    .post(
      "/license-users/:id/two-factor/passkeys/registration-link",
      ({ caller, params, request, set }) => {
        set.status = 201;
        set.headers["cache-control"] = "no-store";
        return { data: passkeys.registrationLink(params.id, changeContext(caller, request)) };
      },
      {
        scope: "licenses:write",
        response: { 201: "passkey.registration_link" },
        detail: {
          summary:
            "A single-use link (24 h) for the user to register a passkey; send it to them. It ends any link sent before.",
          responses: {
            422: errorEnvelopeResponse(
              "INVALID_TRANSITION: the user is disabled (details.from), or the service's base URL has an IP address as its host, which browsers never accept for passkeys (details.reason: base_url_host_is_ip_address).",
            ),
          },
        },
      },
    )
    .post(
      "/license-users/:id/two-factor/unlock",
      ({ caller, params, headers, request, set }) => {
        const row = twoFactor.unlock(
          params.id,
          parseIfMatch(headers["if-match"]),
          changeContext(caller, request),
        );
        set.headers.etag = licenseUserEtag(row);
        return { data: namedUsers.present(row) };
      },
      {
        scope: "licenses:write",
        headers: IfMatchHeaders,
        response: { 200: "license_user.response" },
        detail: { summary: "Unlock two-factor after TWO_FACTOR_LOCKED", responses: { 200: WithEtag } },
      },
    );
