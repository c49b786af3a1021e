import { afterAll, beforeAll, expect, test } from "bun:test";
import { TestDevice } from "../support/device.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { type RuntimeFixture, runtimeFixture } from "../support/runtime.ts";
import { storeDigest } from "../support/store-digest.ts";

/**
 * A full disk, simulated where SQLite sees it: `PRAGMA max_page_count` caps the store at its
 * current size, so any write that needs a new page fails with SQLITE_FULL, exactly as when the
 * volume has no space left. Writes must answer 503 (retryable, nothing changed), not 500, and the
 * very same requests must succeed once space returns.
 */
let t: TestContext;
let fixture: RuntimeFixture;
beforeAll(async () => {
  t = createTestContext();
  fixture = await runtimeFixture(t);
});
afterAll(() => t.close());

const big = (n: number) => "x".repeat(n);
const bigMap = () => Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`k${i}`, big(250)]));

interface Write {
  method: string;
  path: string;
  body: unknown;
  headers: Record<string, string>;
  key?: null;
}

/** Each write carries more than a page of data, so no leftover room in a page can take it. */
const writes = (): Write[] => [
  {
    method: "POST",
    path: "/mgmt/v1/customers",
    body: { name: "Full Disk Ltd", notes: big(5000) },
    headers: { "idempotency-key": "full-disk-customer-01" },
  },
  {
    method: "POST",
    path: "/mgmt/v1/licenses",
    body: { product_id: fixture.productId, policy_id: fixture.policyId, metadata: bigMap() },
    headers: { "idempotency-key": "full-disk-license-001" },
  },
  {
    method: "PATCH",
    path: `/mgmt/v1/licenses/${fixture.licenseId}`,
    body: { metadata: bigMap() },
    headers: {},
  },
];

const setMaxPages = (pages: number) => t.deps.sqlite.run(`PRAGMA max_page_count = ${Math.floor(pages)}`);
const pageCount = () =>
  t.deps.sqlite.query<{ page_count: number }, []>("PRAGMA page_count").get()?.page_count ?? 0;

test("with the disk full, writes answer 503 SERVICE_UNAVAILABLE and change nothing; with space back, the same requests succeed", async () => {
  // No free pages left inside the file (a migration that rebuilt a table leaves some), and what
  // is pending committed first, so the cap applies to the file as it is.
  t.deps.sqlite.run("VACUUM");
  t.deps.sqlite.run("PRAGMA wal_checkpoint(TRUNCATE)");
  expect(
    t.deps.sqlite.query<{ freelist_count: number }, []>("PRAGMA freelist_count").get()?.freelist_count,
  ).toBe(0);
  setMaxPages(pageCount());
  const device = new TestDevice();
  const activationBody = device.activationBody({
    licenseKey: fixture.licenseKey,
    productId: fixture.productId,
    clientTime: Math.floor(t.clock.now().getTime() / 1000),
    machineInfo: {
      os: "linux",
      arch: "x64",
      ...Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`f${i}`, big(250)])),
    },
  });
  const activation: Write = {
    method: "POST",
    path: "/runtime/v1/activations",
    body: activationBody,
    headers: { "idempotency-key": "full-disk-activation-01" },
    key: null,
  };
  for (const write of [...writes(), activation]) {
    const before = storeDigest(t.deps.sqlite);
    const response = await t.call(write.method, write.path, write);
    expect({ path: write.path, status: response.status, code: response.body.error?.code }).toEqual({
      path: write.path,
      status: 503,
      code: "SERVICE_UNAVAILABLE",
    });
    expect(response.body.error.retryable).toBe(true);
    expect(response.body.error.request_id).toBe(response.headers.get("x-request-id"));
    expect(response.headers.get("retry-after")).toBe("5");
    expect(storeDigest(t.deps.sqlite)).toBe(before);
  }
  // Reads still work while the disk is full.
  expect((await t.call("GET", `/mgmt/v1/licenses/${fixture.licenseId}`)).status).toBe(200);

  setMaxPages(1_000_000_000);
  for (const write of [...writes(), activation]) {
    const response = await t.call(write.method, write.path, write);
    expect({ path: write.path, status: response.status }).toEqual({
      path: write.path,
      status: write.method === "PATCH" ? 200 : 201,
    });
    // The failed attempt released its Idempotency-Key: this is a first run, not a replay.
    expect(response.headers.get("idempotent-replayed")).toBeNull();
  }
});
