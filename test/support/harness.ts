import { appendFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createApp } from "../../src/app.ts";
import { resolveConfig } from "../../src/config.ts";
import { Keystore } from "../../src/crypto/keystore.ts";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import type { Deps } from "../../src/deps.ts";
import { AdjustableClock } from "../../src/domain/clock.ts";
import { IdGenerator } from "../../src/domain/ids.ts";
import { SCOPES, type Scope } from "../../src/domain/scopes.ts";
import { clientAddress } from "../../src/http/client-address.ts";
import { type Logger, silentLogger } from "../../src/http/logger.ts";
import { Metrics } from "../../src/http/metrics.ts";
import type { RuntimeRateLimitSettings } from "../../src/http/rate-limit.ts";
import { ApiKeyService } from "../../src/modules/api-keys/service.ts";
import { WorkspaceService } from "../../src/modules/workspace/service.ts";
import { type RunningServer, startServer } from "../../src/server.ts";
import { openStore } from "../../src/store/db.ts";
import { migrate } from "../../src/store/migrate.ts";

export const BASE_URL = "http://licensing.test";

export interface CallOptions {
  key?: string | null;
  body?: unknown;
  rawBody?: string;
  headers?: Record<string, string>;
  /** The socket peer the server would have seen (per-address runtime limits). */
  clientAddress?: string;
}

export interface CallResult {
  status: number;
  headers: Headers;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON response shapes.
  body: any;
  text: string;
}

/**
 * Where every answer of `call` is appended as a JSON line when LICENSING_OPENAPI_RECORD names a
 * file: CI runs the suite so and then checks each answer against the OpenAPI document
 * (test/tools/openapi-audit.ts), so the document is held to thousands of real answers, error
 * paths included, not only to the ones a test of it thought of.
 */
const ANSWER_RECORD = process.env.LICENSING_OPENAPI_RECORD;

function recordAnswer(method: string, path: string, response: Response, body: unknown): void {
  if (!ANSWER_RECORD) return;
  const headers = Object.fromEntries(response.headers);
  appendFileSync(
    ANSWER_RECORD,
    `${JSON.stringify({ method, path, status: response.status, headers, body })}\n`,
  );
}

/**
 * A fresh app over a real SQLite file and a real keystore in a temp directory. Nothing is mocked;
 * only the scrypt cost is lowered so each test's keystore takes milliseconds.
 */
export function createTestContext(
  options: {
    managementRateLimit?: { limit: number; windowSec: number };
    /** Runtime burst windows; all off unless a test sets them. */
    runtimeRateLimits?: Partial<RuntimeRateLimitSettings>;
    trustForwardedFor?: boolean;
    metricsToken?: string;
    /** The service's base URL; BASE_URL unless a test needs another. */
    baseUrl?: string;
    /** Where the app and its services log; silent unless a test reads the lines. */
    logger?: Logger;
  } = {},
) {
  const dir = mkdtempSync(join(tmpdir(), "licensing-test-"));
  const store = openStore(join(dir, "licensing.db"));
  migrate(store.sqlite);
  const keystore = Keystore.create(join(dir, "keystore.json"), "test passphrase", { scryptN: 1024 });
  const clock = new AdjustableClock();
  const deps: Deps = {
    db: store.db,
    sqlite: store.sqlite,
    clock,
    ids: new IdGenerator(),
    secrets: new SecretBox(keystore.secret("data-key")),
    keystore,
  };
  const workspace = new WorkspaceService(deps);
  workspace.ensure();
  const apiKeys = new ApiKeyService(deps);
  const keyFor = (
    environment: "live" | "test",
    scopes: readonly Scope[] = SCOPES,
    name = `${environment} key`,
  ) => apiKeys.create({ environment, scopes: [...scopes], name }).apiKey;
  const keys = { live: keyFor("live"), test: keyFor("test") };
  const app = createApp(deps, {
    baseUrl: options.baseUrl ?? BASE_URL,
    managementRateLimit: options.managementRateLimit
      ? { name: "mgmt", ...options.managementRateLimit }
      : { name: "mgmt", limit: 100_000, windowSec: 1 },
    runtimeRateLimits: { ip: null, activation: null, license: null, ...options.runtimeRateLimits },
    trustForwardedFor: options.trustForwardedFor,
    logger: options.logger,
    metrics: options.metricsToken
      ? { registry: new Metrics({ version: "test", sqlite: store.sqlite }), token: options.metricsToken }
      : undefined,
  });

  async function call(method: string, path: string, opts: CallOptions = {}): Promise<CallResult> {
    const headers: Record<string, string> = { ...opts.headers };
    const key = opts.key === undefined ? keys.live : opts.key;
    if (key !== null) headers.authorization ??= `Bearer ${key}`;
    let body: string | undefined;
    if (opts.rawBody !== undefined) body = opts.rawBody;
    else if (opts.body !== undefined) {
      body = JSON.stringify(opts.body);
      headers["content-type"] ??= "application/json";
    }
    const request = new Request(`${BASE_URL}${path}`, { method, headers, body });
    clientAddress.set(request, opts.clientAddress);
    const response = await app.handle(request);
    const text = await response.text();
    let parsed: unknown = null;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      parsed = null;
    }
    recordAnswer(method, path, response, parsed);
    return { status: response.status, headers: response.headers, body: parsed, text };
  }

  let counter = 0;
  /** A fresh Idempotency-Key for each create, unless a test wants to reuse one. */
  const idem = () => ({ "idempotency-key": `test-idem-key-${Date.now()}-${++counter}` });

  return {
    app,
    deps,
    clock,
    keys,
    keyFor,
    apiKeys,
    workspace,
    dir,
    call,
    idem,
    close() {
      store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export type TestContext = ReturnType<typeof createTestContext>;

/**
 * The real server (Bun.serve on a free port, silent log) over a test context's store and keystore,
 * configured as an operator would: `flags` as on the command line, `env` as the environment.
 */
export function serveTestStore(
  t: Pick<TestContext, "dir">,
  env: Record<string, string> = {},
  flags: Record<string, string> = {},
): RunningServer {
  return startServer({
    config: { ...resolveConfig({ "data-dir": t.dir, ...flags }, env, t.dir), port: 0 },
    passphrase: "test passphrase",
    logger: silentLogger,
  });
}
