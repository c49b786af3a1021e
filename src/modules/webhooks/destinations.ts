import { isIP } from "node:net";
import type { FieldErrorCollector } from "../../http/errors.ts";
import { isPrivateAddress } from "./address.ts";

export type DestinationKind = "standard" | "slack" | "discord" | "teams";

export const MAX_URL_LENGTH = 2048;

/**
 * Team-chat services are recognised by host (and path, where the host also serves other things).
 * Their URLs are bearer secrets: whoever has one can post into the channel.
 */
export function destinationKind(url: URL): DestinationKind {
  // `hooks.slack.com.` (fully qualified) is the same host: the trailing dot must not make a chat
  // URL a plain webhook, whose URL is shown back and whose signed payload the service rejects.
  const host = url.hostname.toLowerCase().replace(/\.$/, "");
  if (host === "hooks.slack.com") return "slack";
  // Discord serves webhooks on every API version's path too (`/api/v10/webhooks/…`).
  if (
    /^(?:(?:www|ptb|canary)\.)?discord(?:app)?\.com$/.test(host) &&
    /^\/api\/(?:v\d+\/)?webhooks\//.test(url.pathname)
  )
    return "discord";
  if (/\.(?:logic\.azure\.com|webhook\.office\.com|powerplatform\.com)$/.test(host)) return "teams";
  return "standard";
}

/** `localhost` and names under it resolve to loopback by definition (RFC 6761 §6.3), whatever DNS says. */
const isLocalhostName = (host: string): boolean => /(?:^|\.)localhost\.?$/i.test(host);

/**
 * A DNS name as resolvers take it: dot-separated labels of letters, digits, `-` and `_` (service
 * names on private networks have them), none empty or longer than 63, no hyphen at either end of
 * a label, 253 characters in all. The URL parser lets through what would never resolve (`a..b`,
 * `*.example.com`, `-a.example`); the vendor hears of it now, not at the first failed delivery.
 */
const isDnsName = (host: string): boolean => {
  const name = host.replace(/\.$/, "");
  return (
    name.length > 0 &&
    name.length <= 253 &&
    name.split(".").every((label) => /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/i.test(label))
  );
};

/** The host without IPv6 brackets, as a resolver and the address check take it. */
export const bareHost = (url: URL): string => url.hostname.replace(/^\[|\]$/g, "");

/**
 * Checks a URL a vendor sends (create, update). What can be decided without DNS is decided here:
 * scheme, credentials, fragment, an IP literal in a private range. Host names are resolved and
 * checked before each attempt (address.ts), since what they resolve to can change.
 */
export function parseDestination(
  raw: string,
  allowPrivateNetworks: boolean,
  errors: FieldErrorCollector,
): { url: URL; kind: DestinationKind } | null {
  // The URL parser forgives what a vendor should be told about: it drops control characters and
  // takes a host from the path of `https:///host/x`. The URL stored must be the one sent.
  // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it refuses.
  if (/[\u0000-\u0020\u007f]/.test(raw)) {
    errors.add("url", "must not contain spaces or control characters");
    return null;
  }
  if (!/^https?:\/\/[^/\\?#]/i.test(raw)) {
    errors.add("url", "must be an absolute http(s) URL with a host (scheme://host/...)");
    return null;
  }
  // A backslash is a slash to the URL parser (`https://a.example\@b.example/` goes to a.example),
  // and an `@` in the authority is userinfo even when empty (`https://@a.example/`).
  if (raw.includes("\\")) {
    errors.add("url", "must not contain a backslash");
    return null;
  }
  if (/^[a-z]+:\/\/[^/?#]*@/i.test(raw)) {
    errors.add("url", "must not carry credentials (user:password@)");
    return null;
  }
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    errors.add("url", "must be an absolute http(s) URL");
    return null;
  }
  const before = errors.empty;
  if (url.protocol !== "https:" && url.protocol !== "http:") errors.add("url", "must use https");
  else if (url.protocol === "http:" && !allowPrivateNetworks)
    errors.add("url", "must use https (http is allowed only when the operator allows private networks)");
  if (url.username || url.password) errors.add("url", "must not carry credentials (user:password@)");
  // `https://a.example/#` has an empty fragment, which `url.hash` does not show; a `#` outside
  // the fragment would have to be percent-encoded.
  if (raw.includes("#")) errors.add("url", "must not carry a fragment");
  const host = bareHost(url);
  if (!host) errors.add("url", "must name a host");
  else if (!isIP(host) && !isDnsName(host))
    errors.add("url", "must name a valid host (a DNS name or an IP address)");
  if (url.port === "0") errors.add("url", "must not use port 0");
  if (!allowPrivateNetworks && (isLocalhostName(host) || (isIP(host) && isPrivateAddress(host))))
    errors.add(
      "url",
      "points at a private, loopback or link-local address, which this server does not allow",
    );
  if (!before || !errors.empty) return null;
  const kind = destinationKind(url);
  if (kind !== "standard" && url.protocol !== "https:") {
    errors.add("url", "team-chat URLs must use https");
    return null;
  }
  return { url, kind };
}

export interface EventSummary {
  type: string;
  environment: string;
  timestamp: string;
  data: Record<string, unknown>;
}

/** One readable line: what happened, to what, by whom. Never a secret: events carry none. */
export function describeEvent(event: EventSummary): string {
  const target = event.data.target as { type?: unknown; id?: unknown } | undefined;
  const actor = event.data.actor as { type?: unknown; name?: unknown; id?: unknown } | undefined;
  const parts = [`[${event.environment}] ${event.type}`];
  if (target && typeof target.id === "string") parts.push(`${String(target.type ?? "object")} ${target.id}`);
  if (actor?.type === "api_key" && typeof actor.name === "string") parts.push(`by API key "${actor.name}"`);
  else if (actor?.type === "cli") parts.push("from the command line");
  else if (actor?.type === "device") parts.push("by a device");
  else if (actor?.type === "billing") parts.push("by the billing integration");
  else if (actor?.type === "license_user" && typeof actor.id === "string")
    parts.push(`by license user ${actor.id}`);
  parts.push(`at ${event.timestamp}`);
  return parts.join(" · ");
}

/** The JSON body each team-chat service accepts on its incoming-webhook URL. */
export function chatMessage(kind: Exclude<DestinationKind, "standard">, event: EventSummary): unknown {
  const text = describeEvent(event);
  switch (kind) {
    case "slack":
      return { text };
    case "discord":
      // Discord refuses content over 2000 characters; no mentions may be triggered by event data.
      return { content: text.slice(0, 2000), allowed_mentions: { parse: [] } };
    case "teams":
      // The shape the Teams "When a Teams webhook request is received" workflow posts as a card.
      return {
        type: "message",
        attachments: [
          {
            contentType: "application/vnd.microsoft.card.adaptive",
            contentUrl: null,
            content: {
              $schema: "http://adaptivecards.io/schemas/adaptive-card.json",
              type: "AdaptiveCard",
              version: "1.4",
              body: [{ type: "TextBlock", text, wrap: true }],
            },
          },
        ],
      };
  }
}
