import type { Database } from "bun:sqlite";
import { cryptoCounters } from "../crypto/keys.ts";

/**
 * Prometheus metrics (text exposition format 0.0.4), kept in plain maps: a handful of counters and
 * one histogram need no client library. Routes are labelled by their template (`/mgmt/v1/licenses/:id`),
 * never by the raw path, so a scan of random URLs cannot grow the label set: whatever matches no
 * route is counted as `unmatched`.
 */
export const DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

interface Histogram {
  buckets: number[];
  sum: number;
  count: number;
}

export const UNMATCHED = "unmatched";

const STANDARD_METHODS = new Set(["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]);

export class Metrics {
  private readonly requests = new Map<string, number>();
  private readonly durations = new Map<string, Histogram>();
  private readonly rateLimited = new Map<string, number>();
  private readonly replays = new Map<string, number>();
  private readonly collectors: (() => string[])[] = [];
  readonly startedAt = Date.now();

  constructor(
    private readonly info: { version: string; sqlite?: Database },
    private matchRoute: (method: string, path: string) => string = () => UNMATCHED,
  ) {}

  /** Lines (with their HELP and TYPE) another part adds to every scrape, e.g. the webhook queue. */
  collect(collector: () => string[]): void {
    this.collectors.push(collector);
  }

  /** The app's routes are known only once it is built; until then everything is `unmatched`. */
  useRoutes(routes: readonly { method: string; path: string }[]): void {
    this.matchRoute = routeMatcher(routes);
  }

  /** One finished request; called with the final response, whatever produced it. */
  observe(method: string, path: string, response: Response, seconds: number): void {
    const route = this.matchRoute(method, path);
    // The method label stays a small closed set: any standard method, matched or not, keeps its
    // name (a GET of a path no route has is still a GET); only made-up methods become OTHER.
    const known = route !== UNMATCHED || STANDARD_METHODS.has(method) ? method : "OTHER";
    bump(this.requests, labels({ method: known, route, status: String(response.status) }));
    const key = labels({ method: known, route });
    let histogram = this.durations.get(key);
    if (!histogram) {
      histogram = { buckets: DURATION_BUCKETS.map(() => 0), sum: 0, count: 0 };
      this.durations.set(key, histogram);
    }
    for (let i = 0; i < DURATION_BUCKETS.length; i++) {
      if (seconds <= (DURATION_BUCKETS[i] as number)) histogram.buckets[i] = (histogram.buckets[i] ?? 0) + 1;
    }
    histogram.sum += seconds;
    histogram.count++;
    // RATE_LIMITED is the only 429; a replay is marked by its header (docs/api.md, Idempotency-Key).
    if (response.status === 429) bump(this.rateLimited, labels({ route }));
    if (response.headers.get("idempotent-replayed") === "true") bump(this.replays, labels({ route }));
  }

  render(): string {
    const out: string[] = [];
    const family = (name: string, type: string, help: string) =>
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    family("licensing_build_info", "gauge", "The running version; always 1.");
    out.push(`licensing_build_info${labels({ version: this.info.version })} 1`);
    family("licensing_process_start_time_seconds", "gauge", "When this process started, in Unix seconds.");
    out.push(`licensing_process_start_time_seconds ${Math.floor(this.startedAt / 1000)}`);

    family(
      "licensing_http_requests_total",
      "counter",
      "Requests answered, by method, route template and status.",
    );
    for (const [key, value] of this.requests) out.push(`licensing_http_requests_total${key} ${value}`);
    family(
      "licensing_http_request_duration_seconds",
      "histogram",
      "Time to answer a request, by method and route template.",
    );
    for (const [key, h] of this.durations) {
      const inner = key.slice(1, -1);
      DURATION_BUCKETS.forEach((le, i) => {
        out.push(`licensing_http_request_duration_seconds_bucket{${inner},le="${le}"} ${h.buckets[i]}`);
      });
      out.push(`licensing_http_request_duration_seconds_bucket{${inner},le="+Inf"} ${h.count}`);
      out.push(`licensing_http_request_duration_seconds_sum${key} ${h.sum}`);
      out.push(`licensing_http_request_duration_seconds_count${key} ${h.count}`);
    }
    family(
      "licensing_rate_limited_total",
      "counter",
      "Requests refused with 429 RATE_LIMITED, by route template.",
    );
    for (const [key, value] of this.rateLimited) out.push(`licensing_rate_limited_total${key} ${value}`);
    family(
      "licensing_idempotency_replays_total",
      "counter",
      "Responses replayed for a repeated Idempotency-Key, by route template.",
    );
    for (const [key, value] of this.replays) out.push(`licensing_idempotency_replays_total${key} ${value}`);

    family(
      "licensing_signatures_total",
      "counter",
      "Signatures made by this process (responses, delegations, certificates, bundles, packages).",
    );
    out.push(`licensing_signatures_total ${cryptoCounters.signatures}`);
    family(
      "licensing_signature_verifications_total",
      "counter",
      "Device signatures checked by this process (proofs), valid or not.",
    );
    out.push(`licensing_signature_verifications_total ${cryptoCounters.verifications}`);

    for (const collector of this.collectors) {
      try {
        out.push(...collector());
      } catch {
        // A collector reading a closed store (during shutdown) drops out; the rest still render.
      }
    }

    const store = this.info.sqlite ? storeSize(this.info.sqlite) : null;
    if (store) {
      family("licensing_store_size_bytes", "gauge", "Size of the SQLite store file (without its WAL).");
      out.push(`licensing_store_size_bytes ${store.bytes}`);
      family("licensing_store_free_bytes", "gauge", "Space inside the store file that is free for reuse.");
      out.push(`licensing_store_free_bytes ${store.free}`);
    }
    return `${out.join("\n")}\n`;
  }
}

function storeSize(sqlite: Database): { bytes: number; free: number } | null {
  try {
    const page = sqlite.query<{ page_size: number }, []>("PRAGMA page_size").get()?.page_size ?? 0;
    const pages = sqlite.query<{ page_count: number }, []>("PRAGMA page_count").get()?.page_count ?? 0;
    const free =
      sqlite.query<{ freelist_count: number }, []>("PRAGMA freelist_count").get()?.freelist_count ?? 0;
    return { bytes: page * pages, free: page * free };
  } catch {
    // A closed store (during shutdown) has no size to report; the other metrics still render.
    return null;
  }
}

const bump = (map: Map<string, number>, key: string) => map.set(key, (map.get(key) ?? 0) + 1);

/** `{a="x",b="y"}` with the format's escaping; label values here are templates and numbers. */
function labels(values: Record<string, string>): string {
  const escaped = (value: string) =>
    value.replaceAll("\\", "\\\\").replaceAll("\n", "\\n").replaceAll('"', '\\"');
  return `{${Object.entries(values)
    .map(([name, value]) => `${name}="${escaped(value)}"`)
    .join(",")}}`;
}

/**
 * The route template a method and path belong to, as the router serves them: static routes win
 * over parameters, so `/docs/errors` is not taken for `/docs/:x`; one trailing slash is ignored
 * (the router serves `/docs/` as `/docs`); HEAD is answered by the GET route; an OPTIONS preflight
 * (answered by the CORS layer for any route) counts under the path's route whatever its method.
 */
export function routeMatcher(routes: readonly { method: string; path: string }[]) {
  const compiled = routes
    .map((route) => ({
      method: route.method,
      template: route.path,
      params: (route.path.match(/:/g) ?? []).length,
      pattern: new RegExp(
        `^${route.path
          .split("/")
          .map((part) => (part.startsWith(":") ? "[^/]+" : part.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")))
          .join("/")}$`,
      ),
    }))
    .sort((a, b) => a.params - b.params);
  return (method: string, path: string): string => {
    const served = path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path;
    const wanted = method === "HEAD" ? "GET" : method;
    const fits = (route: (typeof compiled)[number]) =>
      (wanted === "OPTIONS" || route.method === wanted) && route.pattern.test(served);
    return compiled.find(fits)?.template ?? UNMATCHED;
  };
}
