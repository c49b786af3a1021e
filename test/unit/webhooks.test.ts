import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { ipv6Groups } from "../../src/domain/ip-address.ts";
import { isPrivateAddress } from "../../src/modules/webhooks/address.ts";
import { EVENT_TYPES, isKnownEvent, subscribes } from "../../src/modules/webhooks/catalogue.ts";
import { chatMessage, destinationKind, type EventSummary } from "../../src/modules/webhooks/destinations.ts";

/** The pure parts of webhooks: the address check, the catalogue, destination recognition and chat messages. */
describe("isPrivateAddress", () => {
  test.each([
    "127.0.0.1",
    "127.255.0.9",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.255",
    "192.168.0.1",
    "169.254.169.254",
    "100.64.0.1",
    "0.0.0.0",
    "224.0.0.1",
    "255.255.255.255",
    "198.18.0.1",
    "::",
    "::1",
    "fe80::1",
    "fe80::1%eth0",
    "fc00::1",
    "fd00:ec2::254",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:7f00:1",
    "::ffff:10.1.2.3",
    "::ffff:169.254.169.254",
    "::127.0.0.1",
    "64:ff9b::10.0.0.1",
    "2002:c0a8:0101::1",
    "2001:db8::1",
    "not-an-address",
    "1.2.3",
  ])("refuses %s", (address) => {
    expect(isPrivateAddress(address)).toBe(true);
  });

  test.each([
    "93.184.216.34",
    "8.8.8.8",
    "172.32.0.1",
    "192.169.0.1",
    "100.128.0.1",
    "2606:4700:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::8.8.8.8",
    "2002:0808:0808::1",
  ])("allows the public address %s", (address) => {
    expect(isPrivateAddress(address)).toBe(false);
  });

  test("expands IPv6 spellings to the same groups", () => {
    expect(ipv6Groups("::ffff:127.0.0.1")).toEqual([0, 0, 0, 0, 0, 0xffff, 0x7f00, 1]);
    expect(ipv6Groups("1::")).toEqual([1, 0, 0, 0, 0, 0, 0, 0]);
    expect(ipv6Groups("1:2:3:4:5:6:7:8")).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(ipv6Groups("1:2:3:4:5:6:7")).toBeNull();
    expect(ipv6Groups("1::2::3")).toBeNull();
    expect(ipv6Groups("12345::")).toBeNull();
  });
});

describe("the event catalogue", () => {
  test("holds every audit event type the code records, so each can be subscribed to by name", () => {
    const root = join(import.meta.dir, "../../src");
    const recorded = new Set<string>();
    const walk = (dir: string) => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        const path = join(dir, entry.name);
        if (entry.isDirectory()) walk(path);
        else if (path.endsWith(".ts")) {
          const source = readFileSync(path, "utf8");
          // The literals near each recordAudit call (a ternary may pick between two), and the
          // license changes that collect their event types first.
          for (const call of source.matchAll(/recordAudit\(/g)) {
            const window = source.slice(call.index, call.index + 500);
            const end = window.indexOf("});");
            for (const m of window.slice(0, end === -1 ? undefined : end).matchAll(/"([a-z_]+\.[a-z_]+)"/g))
              recorded.add(m[1] as string);
          }
          for (const m of source.matchAll(/events\.push\("([a-z_]+\.[a-z_]+)"\)/g))
            recorded.add(m[1] as string);
          for (const m of source.matchAll(/enqueue(?:Activation)?Event\([^"]*"([a-z_]+\.[a-z_]+)"/g))
            recorded.add(m[1] as string);
        }
      }
    };
    walk(root);
    expect(recorded.size).toBeGreaterThan(30);
    expect([...recorded].filter((type) => !EVENT_TYPES.includes(type)).sort()).toEqual([]);
  });

  test("knows the wildcard and refuses made-up names", () => {
    expect(isKnownEvent("*")).toBe(true);
    expect(isKnownEvent("license.created")).toBe(true);
    expect(isKnownEvent("license.*")).toBe(false);
    expect(isKnownEvent("LICENSE.CREATED")).toBe(false);
    expect(subscribes(["*"], "anything.new")).toBe(true);
    expect(subscribes(["license.created"], "license.revoked")).toBe(false);
  });

  test("is documented in docs/api.md, name for name", () => {
    const doc = readFileSync(join(import.meta.dir, "../../docs/api.md"), "utf8");
    const start = doc.indexOf("### Webhook events");
    expect(start).toBeGreaterThan(-1);
    const section = doc.slice(start, doc.indexOf("\n### ", start + 5));
    const documented = new Set([...section.matchAll(/`([a-z_]+\.[a-z_]+)`/g)].map((m) => m[1] as string));
    expect([...documented].sort()).toEqual([...EVENT_TYPES].sort());
  });
});

describe("destinations", () => {
  test.each([
    ["https://hooks.slack.com/services/T/B/X", "slack"],
    ["https://discord.com/api/webhooks/1/x", "discord"],
    ["https://ptb.discord.com/api/webhooks/1/x", "discord"],
    ["https://discordapp.com/api/webhooks/1/x", "discord"],
    ["https://hooks.slack.com./services/T/B/X", "slack"],
    ["https://discord.com/api/v10/webhooks/1/x", "discord"],
    ["https://www.discord.com/api/webhooks/1/x", "discord"],
    ["https://Discord.com./api/webhooks/1/x", "discord"],
    ["https://www.discordapp.com/api/v9/webhooks/1/x", "discord"],
    ["https://x.webhook.office.com./webhookb2/y", "teams"],
    ["https://prod-1.westus.logic.azure.com/workflows/x", "teams"],
    ["https://x.webhook.office.com/webhookb2/y", "teams"],
    ["https://d.environment.api.powerplatform.com/p", "teams"],
    ["https://discord.com/channels/1", "standard"],
    ["https://slack.com/api/chat.postMessage", "standard"],
    ["https://hooks.slack.com.evil.example/services/x", "standard"],
    ["https://logic.azure.com.evil.example/x", "standard"],
    ["https://evilwebhook.office.com/x", "standard"],
  ])("%s is %s", (url, kind) => {
    expect(destinationKind(new URL(url))).toBe(kind as ReturnType<typeof destinationKind>);
  });

  const event: EventSummary = {
    type: "license.revoked",
    environment: "live",
    timestamp: "2026-11-22T10:00:00.000Z",
    data: {
      actor: { type: "api_key", id: "key_1", name: "CI" },
      target: { type: "license", id: "lic_01M827EWRXS9TY0RP3NEHM1JG6", environment: "live" },
    },
  };

  test("Slack gets { text }, Discord { content } without mentions, Teams an Adaptive Card", () => {
    const line =
      '[live] license.revoked · license lic_01M827EWRXS9TY0RP3NEHM1JG6 · by API key "CI" · at 2026-11-22T10:00:00.000Z';
    expect(chatMessage("slack", event)).toEqual({ text: line });
    expect(chatMessage("discord", event)).toEqual({ content: line, allowed_mentions: { parse: [] } });
    const teams = chatMessage("teams", event) as {
      type: string;
      attachments: { contentType: string; content: { type: string; body: { text: string }[] } }[];
    };
    expect(teams.type).toBe("message");
    expect(teams.attachments[0]?.contentType).toBe("application/vnd.microsoft.card.adaptive");
    expect(teams.attachments[0]?.content.type).toBe("AdaptiveCard");
    expect(teams.attachments[0]?.content.body[0]?.text).toBe(line);
  });

  test("each kind of actor is named the way a reader knows it", () => {
    const by = (actor: Record<string, string>) =>
      (chatMessage("slack", { ...event, data: { ...event.data, actor } }) as { text: string }).text.split(
        " · ",
      )[2];
    expect(by({ type: "cli", id: "root" })).toBe("from the command line");
    expect(by({ type: "device", id: "a".repeat(64) })).toBe("by a device");
    expect(by({ type: "billing", id: "stripe" })).toBe("by the billing integration");
    expect(by({ type: "license_user", id: "usr_01M8" })).toBe("by license user usr_01M8");
  });

  test("a Discord message stays within Discord's 2000 characters", () => {
    const long = {
      ...event,
      data: { ...event.data, actor: { type: "api_key", id: "k", name: "n".repeat(3000) } },
    };
    expect((chatMessage("discord", long) as { content: string }).content.length).toBe(2000);
  });
});
