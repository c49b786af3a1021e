import {
  LicensingClient,
  type LockManagerLike,
  type MachineInfo,
  MemoryStorage,
  SdkError,
  type Storage,
} from "../../src/sdk/index.ts";
import { BASE_URL, type TestContext } from "./harness.ts";

export const MACHINE: MachineInfo = { os: "linux", arch: "x64", hostname: "air-gapped-1" };

/** The product's integration config, as the app would embed it. */
export async function integrationConfig(t: TestContext, productId: string, key = t.keys.live) {
  const response = await t.call("GET", `/mgmt/v1/products/${productId}/integration-config`, { key });
  if (response.status !== 200) throw new Error(`integration config: ${response.text}`);
  return response.body.data.config as Record<string, unknown>;
}

/** The SDK wired to the in-process app and the test clock. */
export function sdkClient(
  t: TestContext,
  config: Record<string, unknown>,
  options: {
    alg?: "ed25519" | "p256";
    storage?: Storage;
    fetch?: typeof fetch;
    locks?: LockManagerLike;
  } = {},
) {
  const inProcess = (url: string, init?: RequestInit) => t.app.handle(new Request(url, init));
  return new LicensingClient({
    config,
    fetch: (options.fetch ?? inProcess) as never,
    now: () => t.clock.now().getTime(),
    signingAlgorithm: options.alg ?? "ed25519",
    storage: options.storage ?? new MemoryStorage(),
    ...(options.locks === undefined ? {} : { locks: options.locks }),
  });
}

export interface PackageResponse {
  status: number;
  headers: Headers;
  bytes: Uint8Array;
  // biome-ignore lint/suspicious/noExplicitAny: error bodies are arbitrary JSON.
  error: any;
}

/** POST /mgmt/v1/licenses/{id}/offline-certificates with `{ request, ...extra }`. */
export async function requestPackage(
  t: TestContext,
  licenseId: string,
  request: unknown,
  extra: Record<string, unknown> = {},
  key = t.keys.live,
): Promise<PackageResponse> {
  const response = await t.app.handle(
    new Request(`${BASE_URL}/mgmt/v1/licenses/${licenseId}/offline-certificates`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ request, ...extra }),
    }),
  );
  const bytes = new Uint8Array(await response.arrayBuffer());
  let error: unknown = null;
  if (response.status !== 200) error = JSON.parse(new TextDecoder().decode(bytes)).error;
  return { status: response.status, headers: response.headers, bytes, error };
}

/** The SdkError a call is refused with; anything else (or no refusal) fails the test. */
export async function refusal(promise: Promise<unknown>): Promise<SdkError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof SdkError) return error;
    throw error;
  }
  throw new Error("expected the SDK to refuse");
}
