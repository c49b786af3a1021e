import { afterEach, beforeEach, expect } from "bun:test";
import type { Server } from "bun";
import { Webhook } from "standardwebhooks";
import type { Deps } from "../../src/deps.ts";
import { silentLogger } from "../../src/http/logger.ts";
import type { DispatcherOptions } from "../../src/jobs/webhook-dispatch-options.ts";
import { WebhookDispatcher } from "../../src/jobs/webhook-dispatcher.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { createTestContext, type TestContext } from "./harness.ts";

/**
 * What the webhook delivery suites share: a real HTTP receiver on 127.0.0.1 (Bun.serve) that
 * records every request, a fresh store and receiver per test (see useWebhookDeliveryContext), and
 * helpers to subscribe, make an event, run the dispatcher and read the delivery log. Requests are
 * verified with the `standardwebhooks` package, the reference implementation receivers use.
 */
export interface Received {
  path: string;
  headers: Record<string, string>;
  body: string;
}

type Behaviour = (request: Request, n: number) => Response | Promise<Response>;

export class Receiver {
  readonly received: Received[] = [];
  behaviour: Behaviour = () => new Response("ok");
  inFlight = 0;
  maxInFlight = 0;
  private readonly server: Server<undefined>;

  constructor() {
    this.server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch: async (request) => {
        const body = await request.text();
        this.received.push({
          path: new URL(request.url).pathname,
          headers: Object.fromEntries(request.headers.entries()),
          body,
        });
        this.inFlight++;
        this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
        try {
          return await this.behaviour(request, this.received.length);
        } finally {
          this.inFlight--;
        }
      },
    });
  }

  url(path = "/hook"): string {
    return `http://127.0.0.1:${this.server.port}${path}`;
  }

  get port(): number {
    return this.server.port as number;
  }

  stop(): void {
    this.server.stop(true);
  }
}

// Set by each test's beforeEach (see useWebhookDeliveryContext); read through these live bindings.
export let t: TestContext;
export let receiver: Receiver;
export const ctx = {
  actor: { type: "cli" as const, id: "test" },
  environment: "live" as const,
  requestId: null,
};

/** Gives every test in the calling file its own store and receiver, closed and stopped after it. */
export function useWebhookDeliveryContext() {
  beforeEach(() => {
    t = createTestContext();
    receiver = new Receiver();
  });
  afterEach(() => {
    receiver.stop();
    t.close();
  });
}

export const endpoints = (deps: Deps = t.deps, allowPrivateNetworks = true) =>
  new WebhookService(deps, { allowPrivateNetworks });

export function dispatcher(options: Partial<DispatcherOptions> = {}, deps: Deps = t.deps) {
  return new WebhookDispatcher(deps, {
    logger: silentLogger,
    allowPrivateNetworks: true,
    clock: t.clock,
    random: () => 0.5,
    ...options,
  });
}

export function subscribe(url = receiver.url(), events = ["customer.created"]) {
  return endpoints().create({ url, events }, ctx);
}

/** Makes a change through the Management API; its audit event is what gets delivered. */
export async function customerCreated(name = "Ada"): Promise<string> {
  const response = await t.call("POST", "/mgmt/v1/customers", { body: { name }, headers: t.idem() });
  expect(response.status).toBe(201);
  return response.body.data.public_id;
}

export function verify(secret: string, received: Received) {
  return new Webhook(secret).verify(received.body, received.headers) as Record<string, unknown>;
}

export async function deliveries(endpointId: string) {
  const response = await t.call("GET", `/mgmt/v1/webhooks/${endpointId}/deliveries`);
  expect(response.status).toBe(200);
  return response.body.data as Record<string, unknown>[];
}

export async function delivery(endpointId: string, deliveryId: string) {
  const response = await t.call("GET", `/mgmt/v1/webhooks/${endpointId}/deliveries/${deliveryId}`);
  expect(response.status).toBe(200);
  return response.body.data;
}
