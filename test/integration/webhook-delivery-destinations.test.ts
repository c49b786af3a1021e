import { describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Logger } from "../../src/http/logger.ts";
import {
  ctx,
  customerCreated,
  deliveries,
  delivery,
  dispatcher,
  endpoints,
  type Received,
  receiver,
  subscribe,
  t,
  useWebhookDeliveryContext,
  verify,
} from "../support/webhook-receiver.ts";

/**
 * Where and how webhook deliveries go beyond a plain signed POST: https receivers with their
 * certificate checked against the URL's name, signatures during and after a secret rotation,
 * Slack, Discord and Teams URLs that get their service's message shape unsigned, and replaying a
 * finished delivery.
 */
useWebhookDeliveryContext();

describe("https receivers", () => {
  /** A self-signed certificate for `name`, made with openssl for this test only. */
  function certificate(name: string): { key: string; cert: string } {
    const dir = mkdtempSync(join(tmpdir(), "webhook-tls-"));
    try {
      const made = Bun.spawnSync(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
          .concat(["-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem"), "-days", "2"])
          .concat(["-subj", `/CN=${name}`, "-addext", `subjectAltName=DNS:${name}`]),
        { stderr: "pipe" },
      );
      expect(made.exitCode, "openssl must be installed").toBe(0);
      return {
        key: readFileSync(join(dir, "key.pem"), "utf8"),
        cert: readFileSync(join(dir, "cert.pem"), "utf8"),
      };
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  test("connect to the checked address and verify the certificate against the URL's name", async () => {
    const { key, cert } = certificate("hooks.vendor.test");
    const hosts: string[] = [];
    const tlsReceiver = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      tls: { key, cert },
      fetch: async (request) => {
        hosts.push(request.headers.get("host") ?? "");
        await request.text();
        return new Response(null, { status: 204 });
      },
    });
    try {
      const good = subscribe(`https://hooks.vendor.test:${tlsReceiver.port}/in`);
      // The same receiver under a name its certificate does not carry: the TLS check must fail.
      const wrong = subscribe(`https://other.vendor.test:${tlsReceiver.port}/in`);
      await customerCreated();
      const resolved: string[] = [];
      await dispatcher({
        extraCa: cert,
        resolver: async (host) => {
          resolved.push(host);
          return ["127.0.0.1"];
        },
      }).runOnce();
      expect(resolved.sort()).toEqual(["hooks.vendor.test", "other.vendor.test"]);
      expect(hosts).toEqual([`hooks.vendor.test:${tlsReceiver.port}`]);
      expect((await deliveries(good.row.id))[0]).toMatchObject({
        status: "succeeded",
        last_response_status: 204,
      });
      expect((await deliveries(wrong.row.id))[0]).toMatchObject({
        status: "pending",
        last_response_status: null,
      });
    } finally {
      tlsReceiver.stop(true);
    }
  });
});

describe("secret rotation", () => {
  test("during the overlap every delivery verifies with both secrets; after it, only with the new one", async () => {
    const service = endpoints();
    const { row, secret: oldSecret } = subscribe();
    const { secret: newSecret } = service.rotateSecret(row.id, 3600, undefined, ctx);
    await customerCreated("during");
    await dispatcher().runOnce();
    const during = receiver.received[0] as Received;
    expect(during.headers["webhook-signature"]?.split(" ")).toHaveLength(2);
    expect(verify(oldSecret as string, during).type).toBe("customer.created");
    expect(verify(newSecret, during).type).toBe("customer.created");

    t.clock.advance(3601);
    await customerCreated("after");
    await dispatcher().runOnce();
    const after = receiver.received[1] as Received;
    expect(after.headers["webhook-signature"]?.split(" ")).toHaveLength(1);
    expect(verify(newSecret, after).type).toBe("customer.created");
    expect(() => verify(oldSecret as string, after)).toThrow();
  });
});

describe("team-chat destinations", () => {
  test("a Slack URL gets a readable text message and no signature headers; its URL never reaches the log", async () => {
    const lines: string[] = [];
    const logger: Logger = {
      log: (level, msg, fields) => lines.push(JSON.stringify({ level, msg, ...fields })),
    };
    const url = "https://hooks.slack.com/services/T0001/B0002/SECRETPATHTOKEN";
    const { row } = subscribe(url, ["customer.created"]);
    const customerId = await customerCreated();
    receiver.behaviour = (_r, n) => new Response("x", { status: n === 1 ? 500 : 200 });
    const d = dispatcher({
      logger,
      connectOverride: (target) =>
        target.hostname === "hooks.slack.com" ? `http://127.0.0.1:${receiver.port}` : undefined,
    });
    await d.runOnce();
    t.clock.advance(6);
    await d.runOnce();
    expect(receiver.received).toHaveLength(2);
    const got = receiver.received[1] as Received;
    expect(got.path).toBe("/services/T0001/B0002/SECRETPATHTOKEN");
    expect(got.headers["webhook-signature"]).toBeUndefined();
    expect(got.headers["webhook-id"]).toBeUndefined();
    const message = JSON.parse(got.body);
    expect(Object.keys(message)).toEqual(["text"]);
    expect(message.text).toContain("customer.created");
    expect(message.text).toContain(customerId);
    expect(message.text).toContain("[live]");
    expect(lines.length).toBeGreaterThan(0);
    const everything = [
      lines.join("\n"),
      JSON.stringify(await deliveries(row.id)),
      (await t.call("GET", "/mgmt/v1/webhooks")).text,
    ];
    for (const text of everything) expect(text).not.toContain("SECRETPATHTOKEN");
  });
  test.each([
    [
      "Discord",
      "https://discord.com/api/webhooks/42/SECRETPATHTOKEN",
      (m: Record<string, unknown>) => m.content,
    ],
    [
      "Teams",
      "https://prod-1.westeurope.logic.azure.com/workflows/w/triggers/manual/paths/invoke?sig=SECRETPATHTOKEN",
      (m: Record<string, unknown>) =>
        (m as { attachments: { content: { body: { text: string }[] } }[] }).attachments[0]?.content.body[0]
          ?.text,
    ],
  ])("a %s URL gets its service's message shape, unsigned", async (_name, url, textOf) => {
    subscribe(url, ["customer.created"]);
    const customerId = await customerCreated();
    await dispatcher({ connectOverride: () => `http://127.0.0.1:${receiver.port}` }).runOnce();
    const got = receiver.received[0] as Received;
    expect(got.headers["webhook-signature"]).toBeUndefined();
    expect(got.path).toBe(new URL(url).pathname);
    const text = textOf(JSON.parse(got.body));
    expect(text).toContain("customer.created");
    expect(text).toContain(customerId);
  });
});

describe("replay", () => {
  test("sends a finished delivery again with the same id, and refuses one still queued", async () => {
    const { row, secret } = subscribe();
    await customerCreated();
    await dispatcher().runOnce();
    const [done] = await deliveries(row.id);
    const replay = await t.call("POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`);
    expect(replay.status).toBe(200);
    expect(replay.body.data).toMatchObject({ status: "pending", attempts: 1 });
    const again = await t.call("POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`);
    expect(again.status).toBe(422);
    expect(again.body.error.code).toBe("INVALID_TRANSITION");
    await dispatcher().runOnce();
    expect(receiver.received).toHaveLength(2);
    expect(receiver.received[1]?.headers["webhook-id"]).toBe(
      receiver.received[0]?.headers["webhook-id"] as string,
    );
    expect(receiver.received[1]?.body).toBe(receiver.received[0]?.body as string);
    verify(secret as string, receiver.received[1] as Received);
    expect((await delivery(row.id, done?.id as string)).attempt_log).toHaveLength(2);
  });

  test("a test key neither sees nor replays live deliveries", async () => {
    const { row } = subscribe();
    await customerCreated();
    await dispatcher().runOnce();
    const [done] = await deliveries(row.id);
    const list = await t.call("GET", `/mgmt/v1/webhooks/${row.id}/deliveries`, { key: t.keys.test });
    expect(list.body.data).toEqual([]);
    for (const [method, path] of [
      ["GET", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}`],
      ["POST", `/mgmt/v1/webhooks/${row.id}/deliveries/${done?.id}/replay`],
    ] as const) {
      const response = await t.call(method, path, { key: t.keys.test });
      expect(response.status).toBe(404);
    }
  });
});
