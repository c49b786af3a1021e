import { expect } from "bun:test";
import { createHash } from "node:crypto";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import { canonicalLicenseKey, generateLicenseKey } from "../../src/domain/license-key.ts";
import { SCOPES } from "../../src/domain/scopes.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";
import { TestDevice } from "./device.ts";

/**
 * A data directory as the first released schema left it: only migration 0000 applied, and rows
 * written with plain SQL in that schema's columns (no code of today writes them, so a column
 * renamed or reinterpreted later shows up as a failed upgrade). The upgrade tests open it with
 * the current code and the current executable.
 */
export const FIRST_SCHEMA_PASSPHRASE = "first schema passphrase";

const ids = {
  product: "prod_01JZ0000000000000000000001",
  testProduct: "prod_01JZ0000000000000000000002",
  policy: "pol_01JZ0000000000000000000001",
  customer: "cus_01JZ0000000000000000000001",
  license: "lic_01JZ0000000000000000000001",
  reseller: "rsl_01JZ0000000000000000000001",
  event: "evt_01JZ0000000000000000000001",
  apiKey: "key_01JZ0000000000000000000001",
};

export interface FirstSchemaData {
  dataDir: string;
  apiKey: string;
  licenseKey: string;
  ids: typeof ids;
  /** An idempotent create recorded by the old version, with the body that replays it. */
  replay: { idempotencyKey: string; body: Record<string, unknown>; response: Record<string, unknown> };
}

export function createFirstSchemaDataDir(dataDir: string): FirstSchemaData {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // The lowest scrypt cost a keystore may have, so the fixture is quick; the executable accepts it.
  const keystore = Keystore.create(join(dataDir, "keystore.json"), FIRST_SCHEMA_PASSPHRASE, {
    scryptN: 1024,
  });
  const secrets = new SecretBox(keystore.secret("data-key"));
  const store = openStore(join(dataDir, "licensing.db"));
  const [first] = embeddedMigrations();
  if (first?.tag !== "0000_initial") throw new Error("the first migration is not 0000_initial");
  migrate(store.sqlite, [first]);

  const at = Date.UTC(2026, 0, 15, 12, 0, 0);
  const apiKey = `lsk_live_${"F".repeat(16)}${"s".repeat(16)}`;
  const licenseKey = generateLicenseKey();
  const canonical = canonicalLicenseKey(licenseKey) as string;
  const replayBody = { name: "Replayed Ltd" };
  const replayResponse = { data: { public_id: "cus_01JZ0000000000000000000009", name: "Replayed Ltd" } };
  const run = (sql: string, ...values: (string | number | null)[]) => store.sqlite.run(sql, values);

  run("INSERT INTO workspace VALUES ('default', 'Acme Software', 'self_hosted', ?, ?)", at, at);
  run(
    "INSERT INTO api_keys (id, environment, name, scopes, token_hash, token_hint, created_at) VALUES (?, 'live', 'old key', ?, ?, ?, ?)",
    ids.apiKey,
    JSON.stringify(SCOPES),
    createHash("sha256").update(apiKey).digest("hex"),
    `${apiKey.slice(0, 13)}…`,
    at,
  );
  for (const [id, environment, code] of [
    [ids.product, "live", "desk"],
    [ids.testProduct, "test", "desk"],
  ] as const) {
    // No signing keys existed in this schema: the product waits as `pending`, as the old version left it.
    run(
      `INSERT INTO products (id, environment, name, code, description, status, trust_bundle_sequence, signing_status, version, created_at, updated_at)
       VALUES (?, ?, 'Desk Pro', ?, 'The desktop app', 'active', 0, 'pending', 3, ?, ?)`,
      id,
      environment,
      code,
      at,
      at + 1000,
    );
  }
  run(
    `INSERT INTO policies (id, product_id, environment, name, policy_number, revision, status, license_type, validation_mode,
       fail_mode, identity_mode, perpetual_mode, concurrency_unit, renewal_authority, billing_cycle, fingerprint_profile,
       heartbeat_required, max_machines, max_concurrent, license_unit_limit, cert_ttl_sec, heartbeat_sec, lease_ttl_sec,
       lease_heartbeat_sec, network_grace_sec, trial_days, entitlements, created_at, updated_at)
     VALUES (?, ?, 'live', 'Standard', 1, 2, 'active', 'perpetual', 'online', 'open', 'device', 'managed', 'device', 'vendor',
       'none', 'standard', 0, 3, NULL, NULL, 86400, 3600, 900, 300, 86400, 0, '{"pro":true,"seats":5}', ?, ?)`,
    ids.policy,
    ids.product,
    at,
    at,
  );
  run(
    "INSERT INTO customers (id, name, email, external_ref, notes, status, revision, created_at, updated_at) VALUES (?, 'Globex', 'ops@globex.example', 'crm-42', 'VIP', 'active', 1, ?, ?)",
    ids.customer,
    at,
    at,
  );
  run(
    `INSERT INTO licenses (id, environment, product_id, policy_id, customer_id, key_ciphertext, key_lookup, license_type, status,
       expires_at, renewal_authority, entitlements, metadata, version, created_at, updated_at)
     VALUES (?, 'live', ?, ?, ?, ?, ?, 'perpetual', 'active', NULL, 'vendor', '{"beta":true}', '{"order":"SO-1001"}', 2, ?, ?)`,
    ids.license,
    ids.product,
    ids.policy,
    ids.customer,
    secrets.encrypt(canonical, `license-key:${ids.license}`),
    secrets.lookupHash(canonical, "license-key"),
    at,
    at,
  );
  run(
    "INSERT INTO resellers (id, name, email, status, metadata, revision, created_at, updated_at) VALUES (?, 'Channel Co', 'sales@channel.example', 'active', '{\"region\":\"EU\"}', 1, ?, ?)",
    ids.reseller,
    at,
    at,
  );
  run(
    "INSERT INTO audit_events VALUES (?, 'live', 'product.created', ?, 'product', ?, '{}', 'req_01JZ0000000000000000000001', ?)",
    ids.event,
    JSON.stringify({ type: "api_key", id: ids.apiKey, name: "old key" }),
    ids.product,
    at,
  );
  // Stored in the clear, as the first version did; the replay must still answer with it.
  run(
    `INSERT INTO idempotency_records VALUES (?, 'POST', '/mgmt/v1/customers', 'old-idempotency-key-01', ?, 'completed', 201, ?, '{}', ?, ?)`,
    ids.apiKey,
    createHash("sha256").update(canonicalize(replayBody)).digest("hex"),
    JSON.stringify(replayResponse),
    Date.now(),
    Date.now() + 24 * 3600 * 1000,
  );
  store.sqlite.run("PRAGMA wal_checkpoint(TRUNCATE)");
  store.close();
  return {
    dataDir,
    apiKey,
    licenseKey,
    ids,
    replay: { idempotencyKey: "old-idempotency-key-01", body: replayBody, response: replayResponse },
  };
}

/** What the current API must answer for the rows above. */
export const expectedFirstSchemaReads = (data: FirstSchemaData) => ({
  product: {
    public_id: data.ids.product,
    name: "Desk Pro",
    code: "desk",
    description: "The desktop app",
    environment: "live",
    status: "active",
    version: 3,
  },
  policy: {
    public_id: data.ids.policy,
    product_id: data.ids.product,
    name: "Standard",
    license_type: "perpetual",
    max_machines: 3,
    entitlements: { pro: true, seats: 5 },
  },
  customer: {
    public_id: data.ids.customer,
    name: "Globex",
    email: "ops@globex.example",
    external_ref: "crm-42",
  },
  license: {
    public_id: data.ids.license,
    key: data.licenseKey,
    product_id: data.ids.product,
    policy_id: data.ids.policy,
    customer_id: data.ids.customer,
    status: "active",
    metadata: { order: "SO-1001" },
    version: 2,
  },
  reseller: { public_id: data.ids.reseller, name: "Channel Co", email: "sales@channel.example" },
});

/**
 * Reads everything back through the HTTP API of a server started on the upgraded data dir, and
 * checks that it still works: replays, signing (keys made for the pending product), activation.
 */
export async function expectUpgradedDataIntact(url: string, data: FirstSchemaData): Promise<void> {
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}) => {
    const response = await fetch(`${url}${path}`, {
      method,
      headers: {
        authorization: `Bearer ${data.apiKey}`,
        ...(body === undefined ? {} : { "content-type": "application/json" }),
        ...headers,
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return { status: response.status, headers: response.headers, body: await response.json() };
  };
  const expected = expectedFirstSchemaReads(data);
  const reads = {
    product: await call("GET", `/mgmt/v1/products/${data.ids.product}`),
    policy: await call("GET", `/mgmt/v1/policies/${data.ids.policy}`),
    customer: await call("GET", `/mgmt/v1/customers/${data.ids.customer}`),
    license: await call("GET", `/mgmt/v1/licenses/${data.ids.license}`),
    reseller: await call("GET", `/mgmt/v1/resellers/${data.ids.reseller}`),
  };
  for (const [name, read] of Object.entries(reads)) {
    expect({ name, status: read.status }).toEqual({ name, status: 200 });
    expect(read.body.data).toMatchObject(expected[name as keyof typeof expected]);
  }
  const events = await call("GET", "/mgmt/v1/events");
  expect(events.body.data.map((e: { id: string }) => e.id)).toContain(data.ids.event);
  // The test product stays invisible to the live key, as it was.
  expect((await call("GET", `/mgmt/v1/products/${data.ids.testProduct}`)).status).toBe(404);

  const replay = await call("POST", "/mgmt/v1/customers", data.replay.body, {
    "idempotency-key": data.replay.idempotencyKey,
  });
  expect(replay.status).toBe(201);
  expect(replay.headers.get("idempotent-replayed")).toBe("true");
  expect(replay.body).toEqual(data.replay.response);

  const bundle = await call("GET", `/runtime/v1/products/${data.ids.product}/trust-bundle`);
  expect(bundle.status).toBe(200);
  const activation = await call(
    "POST",
    "/runtime/v1/activations",
    new TestDevice().activationBody({
      licenseKey: data.licenseKey,
      productId: data.ids.product,
      clientTime: Math.floor(Date.now() / 1000),
    }),
    { "idempotency-key": "upgrade-activation-0001" },
  );
  expect(activation.status).toBe(201);
  const patched = await call("PATCH", `/mgmt/v1/licenses/${data.ids.license}`, {
    metadata: { order: "SO-1002" },
  });
  expect(patched.body.data).toMatchObject({
    version: 3,
    metadata: { order: "SO-1002" },
    key: data.licenseKey,
  });
}
