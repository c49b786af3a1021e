import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { SCOPES } from "../../src/domain/scopes.ts";
import { type Listing, PageCursors } from "../../src/http/pagination.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { concretePath, ETAG_SOURCES, type Ids, MANAGEMENT_ROUTES, seedResources } from "./route-table.ts";

/**
 * The shared security suite: every management route, generated from one table, answers the same
 * way to a missing key, a key without its scope, another environment's resource, a malformed id
 * and an unknown body field; every route that changes a resource's ETag to If-Match, and every
 * deletion of a resource without one; and every list to a cursor it did not issue.
 */
let t: TestContext;
let ids: { live: Ids; test: Ids };

beforeEach(() => {
  t = createTestContext();
  ids = seedResources(t);
});
afterEach(() => t.close());

const pathFor = (route: (typeof MANAGEMENT_ROUTES)[number], env: "live" | "test" = "live") =>
  route.resource ? concretePath(route, ids[env][route.resource]) : route.path;

const bodyFor = (route: (typeof MANAGEMENT_ROUTES)[number]) => route.body?.(ids.live);

function expectEnvelope(response: Awaited<ReturnType<TestContext["call"]>>, status: number, code: string) {
  expect(response.status).toBe(status);
  expect(response.body.error.code).toBe(code);
  expect(Object.keys(response.body.error).sort()).toEqual(
    ["code", "details", "doc_url", "message", "request_id", "retryable"].sort(),
  );
  expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
}

const auditCount = () =>
  (t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get() as { n: number }).n;

/** The resource as its detail route shows it, with its ETag: what a refused change must leave as it was. */
async function readBack(route: (typeof MANAGEMENT_ROUTES)[number]) {
  const source = route.resource ? ETAG_SOURCES[route.resource] : undefined;
  if (!source || !route.resource)
    throw new Error(`${route.method} ${route.path} names no resource with an ETag`);
  const response = await t.call("GET", source.replace(":id", ids.live[route.resource]));
  expect(response.status).toBe(200);
  const etag = response.headers.get("etag");
  expect(etag).toMatch(/^"[^"]+"$/);
  return { body: response.body, etag: etag as string };
}

test("the routes that take If-Match are exactly those the table marks, each on a resource with an ETag or marked as without one", async () => {
  const doc = (await t.call("GET", "/openapi.json", { key: null })).body as {
    paths: Record<string, Record<string, { parameters?: { in: string; name: string }[] }>>;
  };
  const documented: string[] = [];
  for (const [path, operations] of Object.entries(doc.paths)) {
    for (const [method, operation] of Object.entries(operations)) {
      if (operation.parameters?.some((p) => p.in === "header" && p.name === "if-match"))
        documented.push(`${method.toUpperCase()} ${path.replace(/\{(\w+)\}/g, ":$1")}`);
    }
  }
  const marked = MANAGEMENT_ROUTES.filter((r) => r.ifMatch || r.noEtag).map((r) => `${r.method} ${r.path}`);
  expect(documented.sort()).toEqual(marked.sort());
  for (const route of MANAGEMENT_ROUTES.filter((r) => r.ifMatch)) {
    expect(route.resource && ETAG_SOURCES[route.resource]).toBeString();
  }
});

test("the route table lists every management route the app serves", () => {
  const served = t.app.routes
    .filter((r) => r.path.startsWith("/mgmt/"))
    .map((r) => `${r.method} ${r.path}`)
    .sort();
  const listed = MANAGEMENT_ROUTES.map((r) => `${r.method} ${r.path}`).sort();
  expect(served).toEqual(listed);
});

describe.each(MANAGEMENT_ROUTES.map((r) => [`${r.method} ${r.path}`, r] as const))("%s", (_name, route) => {
  test("without an API key answers 401 UNAUTHENTICATED", async () => {
    const response = await t.call(route.method, pathFor(route), {
      key: null,
      body: bodyFor(route),
      headers: t.idem(),
    });
    expectEnvelope(response, 401, "UNAUTHENTICATED");
    expect(response.headers.get("www-authenticate")).toContain("Bearer");
  });

  test("with a revoked or made-up key answers 401", async () => {
    const made = await t.call(route.method, pathFor(route), {
      key: `lsk_live_${"x".repeat(32)}`,
      body: bodyFor(route),
    });
    expectEnvelope(made, 401, "UNAUTHENTICATED");
    const revoked = t.apiKeys.create({ environment: "live", scopes: [...SCOPES], name: "revoked" });
    t.apiKeys.revoke(revoked.id);
    expectEnvelope(
      await t.call(route.method, pathFor(route), { key: revoked.apiKey, body: bodyFor(route) }),
      401,
      "UNAUTHENTICATED",
    );
    const wrongScheme = await t.call(route.method, pathFor(route), {
      key: null,
      headers: { authorization: `Basic ${t.keys.live}` },
    });
    expectEnvelope(wrongScheme, 401, "UNAUTHENTICATED");
  });

  test("with a key lacking its scope answers 403 INSUFFICIENT_SCOPE and changes nothing", async () => {
    const others = SCOPES.filter((s) => s !== route.scope);
    const key = t.keyFor("live", others, "no-scope");
    const eventsBefore = t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get();
    const response = await t.call(route.method, pathFor(route), {
      key,
      body: bodyFor(route),
      headers: t.idem(),
    });
    expectEnvelope(response, 403, "INSUFFICIENT_SCOPE");
    expect(response.body.error.details.required_scope).toBe(route.scope);
    expect(t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get()).toEqual(eventsBefore);
  });

  if (route.resource) {
    test("with a malformed id answers 404 NOT_FOUND", async () => {
      const response = await t.call(route.method, concretePath(route, "not-an-id"), { body: bodyFor(route) });
      expectEnvelope(response, 404, "NOT_FOUND");
    });
  }

  if (route.resource) {
    test("with a well-formed id that does not exist answers 404 NOT_FOUND", async () => {
      const prefix = ids.live[route.resource as keyof Ids].split("_")[0];
      const response = await t.call(
        route.method,
        concretePath(route, `${prefix}_01M81Z00000000000000000000`),
        {
          body: bodyFor(route),
        },
      );
      expectEnvelope(response, 404, "NOT_FOUND");
    });
  }

  if (route.idempotency === "required") {
    test("without an Idempotency-Key answers 400, even for an invalid body, and creates nothing", async () => {
      const eventsBefore = t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get();
      const response = await t.call(route.method, pathFor(route), { body: bodyFor(route) });
      expectEnvelope(response, 400, "INVALID_REQUEST");
      const invalid = await t.call(route.method, pathFor(route), {
        body: { ...bodyFor(route), unknown_field: 1 },
      });
      expectEnvelope(invalid, 400, "INVALID_REQUEST");
      expect(t.deps.sqlite.query("SELECT count(*) AS n FROM audit_events").get()).toEqual(eventsBefore);
    });
  }

  if (route.idempotency) {
    test("reusing an Idempotency-Key with another body answers 409 IDEMPOTENCY_CONFLICT", async () => {
      const headers = { "idempotency-key": `shared-suite-${route.path}` };
      const first = await t.call(route.method, pathFor(route), { body: bodyFor(route), headers });
      expect(first.status).toBe(201);
      const replay = await t.call(route.method, pathFor(route), { body: bodyFor(route), headers });
      expect(replay.headers.get("idempotent-replayed")).toBe("true");
      const variant = route.variant?.(ids.live) ?? { ...bodyFor(route), name: "Other" };
      const other = await t.call(route.method, pathFor(route), { body: variant, headers });
      expectEnvelope(other, 409, "IDEMPOTENCY_CONFLICT");
    });
  }

  if (route.noEtag) {
    test("its resource has no ETag: any entity-tag answers 409, a malformed If-Match 400, and nothing changes", async () => {
      const events = auditCount();
      for (const ifMatch of ['"stale"', "1", 'W/"x"', '"a", "b"']) {
        const response = await t.call(route.method, pathFor(route), { headers: { "if-match": ifMatch } });
        expectEnvelope(response, 409, "VERSION_CONFLICT");
        expect(response.body.error.details).toEqual({ current_etag: null });
      }
      for (const ifMatch of ['"unbalanced', "abc", '*, "a"', ""]) {
        const response = await t.call(route.method, pathFor(route), { headers: { "if-match": ifMatch } });
        expectEnvelope(response, 400, "INVALID_REQUEST");
      }
      expect(auditCount()).toBe(events);
      // `*` matches what there is: the deletion goes on.
      expect((await t.call(route.method, pathFor(route), { headers: { "if-match": "*" } })).status).toBe(204);
      expect(auditCount()).toBe(events + 1);
    });
  }

  if (route.ifMatch) {
    test("a stale If-Match answers 409 VERSION_CONFLICT with the current ETag and changes nothing", async () => {
      const before = await readBack(route);
      const events = auditCount();
      const response = await t.call(route.method, pathFor(route), {
        body: bodyFor(route),
        headers: { "if-match": '"stale"' },
      });
      expectEnvelope(response, 409, "VERSION_CONFLICT");
      expect(response.body.error.details.current_etag).toBe(before.etag);
      expect(await readBack(route)).toEqual(before);
      expect(auditCount()).toBe(events);
    });

    test("a weak If-Match never matches, not even the current tag's weak form: 409 and nothing changes", async () => {
      const before = await readBack(route);
      const events = auditCount();
      for (const ifMatch of [`W/${before.etag}`, `W/"stale", W/${before.etag}`]) {
        const response = await t.call(route.method, pathFor(route), {
          body: bodyFor(route),
          headers: { "if-match": ifMatch },
        });
        expectEnvelope(response, 409, "VERSION_CONFLICT");
      }
      expect(await readBack(route)).toEqual(before);
      expect(auditCount()).toBe(events);
    });

    test("a malformed If-Match answers 400 INVALID_REQUEST and changes nothing", async () => {
      const before = await readBack(route);
      const events = auditCount();
      const unbalanced = before.etag.slice(0, -1);
      for (const ifMatch of [unbalanced, `*, ${before.etag}`, `${before.etag} ${before.etag}`, "abc", ""]) {
        const response = await t.call(route.method, pathFor(route), {
          body: bodyFor(route),
          headers: { "if-match": ifMatch },
        });
        expectEnvelope(response, 400, "INVALID_REQUEST");
      }
      expect(await readBack(route)).toEqual(before);
      expect(auditCount()).toBe(events);
    });

    test("a list of strong tags holding the current ETag matches", async () => {
      const { etag } = await readBack(route);
      const response = await t.call(route.method, pathFor(route), {
        body: bodyFor(route),
        headers: { "if-match": `"stale", W/"x", ${etag}` },
      });
      // Past the precondition: found, not refused by it, not failed (a route whose table body
      // is not acceptable, such as a made-up TOTP code, may still answer 422 after it).
      expect([400, 404, 409]).not.toContain(response.status);
      expect(response.status).toBeLessThan(500);
    });
  }

  // Decided while the tests are collected, before any resource exists: only `:id` gets filled in.
  if (route.method === "GET" && !concretePath(route, "id").includes(":")) {
    test("answers a pagination object only if the table marks it as a list", async () => {
      const response = await t.call("GET", pathFor(route));
      expect(response.status).toBe(200);
      expect(response.body.pagination !== undefined).toBe(route.list !== undefined);
    });
  }

  if (route.list) {
    const { idPrefix, order } = route.list;
    test("a cursor this listing did not issue answers 400 INVALID_REQUEST; one it issued is taken", async () => {
      const cursors = new PageCursors(t.deps.secrets);
      const direction = order === "oldest" ? "after" : "before";
      const position = `${idPrefix}_01M81Z00000000000000000000`;
      const own: Listing = {
        route: route.path,
        idPrefix,
        environment: "live",
        filters: route.resource ? { id: ids.live[route.resource] } : {},
      };
      const listPath = (cursor: string) => `${pathFor(route)}?cursor=${encodeURIComponent(cursor)}`;
      const genuine = cursors.issue(own, direction, position);
      expect(genuine).toMatch(/^[A-Za-z0-9_-]{1,64}$/);
      expect((await t.call("GET", listPath(genuine))).status).toBe(200);
      const other = MANAGEMENT_ROUTES.find((r) => r.list && r.path !== route.path && !r.resource);
      const refused = [
        // What the earlier format accepted: the position in plain (base64url) JSON.
        Buffer.from(JSON.stringify({ [direction]: position })).toString("base64url"),
        Buffer.from(JSON.stringify({ [direction]: `${idPrefix}_${"Z".repeat(26)}` })).toString("base64url"),
        // The genuine cursor in standard base64, and altered in its position or its tag.
        `${genuine.replaceAll("-", "+").replaceAll("_", "/")}=`,
        `${genuine.slice(0, 5)}${genuine[5] === "A" ? "B" : "A"}${genuine.slice(6)}`,
        `${genuine.slice(0, -1)}${genuine.endsWith("A") ? "B" : "A"}`,
        // Genuine cursors of another listing, the other environment, other filters, the other direction.
        cursors.issue({ ...own, route: other?.path ?? "/mgmt/v1/other" }, direction, position),
        cursors.issue({ ...own, environment: "test" }, direction, position),
        cursors.issue({ ...own, filters: { ...own.filters, status: "x" } }, direction, position),
        cursors.issue(own, direction === "before" ? "after" : "before", position),
      ];
      for (const cursor of refused) {
        expectEnvelope(await t.call("GET", listPath(cursor)), 400, "INVALID_REQUEST");
      }
    });
  }

  if (route.environmentScoped) {
    test("for the other environment's resource answers 404, as if it did not exist", async () => {
      const response = await t.call(route.method, pathFor(route, "test"), { body: bodyFor(route) });
      expectEnvelope(response, 404, "NOT_FOUND");
    });
  }

  if (route.body) {
    test("with an unknown body field answers 422 naming the field", async () => {
      const response = await t.call(route.method, pathFor(route), {
        body: { ...bodyFor(route), unknown_field: true },
        headers: t.idem(),
      });
      expectEnvelope(response, 422, "VALIDATION_FAILED");
      expect(response.body.error.details.errors.unknown_field).toBeDefined();
    });

    test("with unknown fields named after Object.prototype members answers 422, not 500", async () => {
      const text = JSON.stringify(bodyFor(route)).replace(
        /^\{/,
        '{"__proto__":{"x":1},"constructor":1,"toString":2,',
      );
      const response = await t.call(route.method, pathFor(route), {
        rawBody: text.replace(/,\}$/, "}"),
        headers: { "content-type": "application/json", ...t.idem() },
      });
      expectEnvelope(response, 422, "VALIDATION_FAILED");
      expect(Object.keys(response.body.error.details.errors)).toEqual(
        expect.arrayContaining(["constructor", "toString"]),
      );
    });

    test("with a key lacking its scope answers 403 even when the body is malformed", async () => {
      const key = t.keyFor(
        "live",
        SCOPES.filter((s) => s !== route.scope),
        "no-scope",
      );
      const response = await t.call(route.method, pathFor(route), {
        key,
        rawBody: "{not json",
        headers: { "content-type": "application/json", ...t.idem() },
      });
      expectEnvelope(response, 403, "INSUFFICIENT_SCOPE");
    });
  }
});
