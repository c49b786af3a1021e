import { unixSeconds } from "../../src/domain/clock.ts";
import { type DeviceAlg, TestDevice } from "./device.ts";
import type { TrustBundleBody } from "./envelope.ts";
import type { CallResult, TestContext } from "./harness.ts";

export interface RuntimeFixture {
  productId: string;
  policyId: string;
  licenseId: string;
  licenseKey: string;
  bundle: TrustBundleBody;
  rootPublicKey: string;
}

/** A product, a policy (with overrides) and a license, made through the Management API. */
export async function runtimeFixture(
  t: TestContext,
  options: { policy?: Record<string, unknown>; license?: Record<string, unknown>; key?: string } = {},
): Promise<RuntimeFixture> {
  const key = options.key ?? t.keys.live;
  const environment = key === t.keys.test ? "test" : "live";
  const product = await t.call("POST", "/mgmt/v1/products", {
    key,
    body: { name: "Desk", code: `desk-${Math.random().toString(36).slice(2, 10)}`, environment },
    headers: t.idem(),
  });
  const productId = product.body.data.public_id;
  const policy = await t.call("POST", "/mgmt/v1/policies", {
    key,
    body: { product_id: productId, name: "Std", ...options.policy },
    headers: t.idem(),
  });
  if (policy.status !== 201) throw new Error(`policy: ${policy.text}`);
  const license = await t.call("POST", "/mgmt/v1/licenses", {
    key,
    body: { product_id: productId, policy_id: policy.body.data.public_id, ...options.license },
    headers: t.idem(),
  });
  if (license.status !== 201) throw new Error(`license: ${license.text}`);
  const config = await t.call("GET", `/mgmt/v1/products/${productId}/integration-config`, { key });
  const anchor = config.body.data.config.trust_anchor;
  const bundle = await t.call("GET", `/runtime/v1/products/${productId}/trust-bundle`, { key: null });
  return {
    productId,
    policyId: policy.body.data.public_id,
    licenseId: license.body.data.public_id,
    licenseKey: license.body.data.key,
    bundle: bundle.body.data.bundle,
    rootPublicKey: anchor.root_public_key ?? anchor.development_root_public_key,
  };
}

export const nowSec = (t: TestContext) => unixSeconds(t.clock.now());

export function activate(
  t: TestContext,
  device: TestDevice,
  fixture: Pick<RuntimeFixture, "licenseKey" | "productId">,
  options: { body?: Record<string, unknown>; idempotencyKey?: string; clientTime?: number } = {},
): Promise<CallResult> {
  const body = device.activationBody({
    licenseKey: fixture.licenseKey,
    productId: fixture.productId,
    clientTime: options.clientTime ?? nowSec(t),
    extra: options.body,
  });
  return t.call("POST", "/runtime/v1/activations", {
    key: null,
    body,
    headers: {
      "idempotency-key": options.idempotencyKey ?? `activation-${Math.random().toString(36).slice(2)}-x`,
    },
  });
}

/** A device-proof request, signed over exactly the bytes sent. */
export function proofCall(
  t: TestContext,
  device: TestDevice,
  method: string,
  path: string,
  activationId: string,
  body?: unknown,
  options: { timestamp?: number; nonce?: string; headers?: Record<string, string> } = {},
): Promise<CallResult> {
  const text = body === undefined ? "" : JSON.stringify(body);
  const headers = {
    ...device.proofHeaders(method, path, activationId, text, {
      timestamp: options.timestamp ?? nowSec(t),
      nonce: options.nonce,
    }),
    ...(body === undefined ? {} : { "content-type": "application/json" }),
    ...options.headers,
  };
  return t.call(method, path, { key: null, rawBody: body === undefined ? undefined : text, headers });
}

/** Activates a new device and returns it with its activation id. */
export async function activatedDevice(t: TestContext, fixture: RuntimeFixture, alg: DeviceAlg = "ed25519") {
  const device = new TestDevice(alg);
  const response = await activate(t, device, fixture);
  if (response.status !== 201) throw new Error(`activation: ${response.text}`);
  return { device, activationId: response.body.data.activation_id as string, response };
}

export const heartbeatPath = (activationId: string) => `/runtime/v1/activations/${activationId}/heartbeat`;
