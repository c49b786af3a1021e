import { WebhookService } from "../../src/modules/webhooks/service.ts";
import type { TestContext } from "./harness.ts";

/** A webhook endpoint made through the service (as the CLI actor), for suites that need one to exist. */
export function seedWebhook(t: TestContext, url = "https://receiver.example.com/hook"): string {
  const service = new WebhookService(t.deps, { allowPrivateNetworks: false });
  return service.create({ url }, { actor: { type: "cli", id: "test" }, environment: "live", requestId: null })
    .row.id;
}
