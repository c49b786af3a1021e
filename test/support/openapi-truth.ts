import Ajv2020 from "ajv/dist/2020.js";
import addFormats from "ajv-formats";

/**
 * Whether the OpenAPI document tells the truth about a real answer, as a client generator reads
 * it: the status declared for the operation, the JSON body valid for the declared schema with no
 * top-level member the schema leaves out, each header the service sent that a client acts on
 * declared for that status, and the headers declared as always sent really sent.
 */

type Json = Record<string, unknown>;
type Answer = { description?: string; headers?: Json; content?: Record<string, { schema?: Json }> };
type Operation = { responses: Record<string, Answer> };
/** The parts of an answer the check reads: a fetch Response's, or a recorded one's. */
export interface ObservedAnswer {
  status: number;
  headers: { has(name: string): boolean; get(name: string): string | null };
  body: unknown;
}

/** The response headers the service sends that a client may act on. */
export const CHECKED_HEADERS = [
  "x-request-id",
  "etag",
  "idempotent-replayed",
  "retry-after",
  "ratelimit",
  "ratelimit-policy",
  "x-offline-package-id",
];

const pointerSegment = (segment: string) => segment.replace(/~/g, "~0").replace(/\//g, "~1");

export class OpenApiTruth {
  private readonly ajv = new Ajv2020({ strict: false, allErrors: true });
  private readonly templates: { template: string; pattern: RegExp; parameters: number }[];
  private readonly validators = new Map<string, ReturnType<Ajv2020["compile"]>>();

  // biome-ignore lint/suspicious/noExplicitAny: the document is arbitrary JSON, read as the spec lays it out.
  constructor(readonly doc: any) {
    addFormats(this.ajv);
    this.ajv.addSchema({ ...doc, $id: "doc" });
    this.templates = Object.keys(doc.paths).map((template) => ({
      template,
      pattern: new RegExp(`^${template.replace(/\{[^}]+\}/g, "[^/]+")}$`),
      parameters: template.match(/\{/g)?.length ?? 0,
    }));
  }

  /** The documented path a concrete one falls under, preferring literal segments over parameters. */
  templateOf(method: string, url: string): string | undefined {
    const path = url.split("?")[0] as string;
    const verb = method.toLowerCase();
    return this.templates
      .filter(({ template, pattern }) => this.doc.paths[template][verb] !== undefined && pattern.test(path))
      .sort((a, b) => a.parameters - b.parameters)[0]?.template;
  }

  /** What the document gets wrong about this answer; empty when it tells the truth. */
  mismatches(method: string, url: string, answer: ObservedAnswer): string[] {
    const template = this.templateOf(method, url);
    if (!template) return [`${method} ${url.split("?")[0]} is not documented`];
    const verb = method.toLowerCase();
    const where = `${method} ${template} ${answer.status}`;
    const operation: Operation = this.doc.paths[template][verb];
    const declared = operation.responses[answer.status];
    if (!declared) {
      const code = (answer.body as { error?: { code?: string } } | null)?.error?.code;
      return [`${where} is not declared${code ? ` (${code})` : ""}`];
    }
    const problems: string[] = [];
    const declaredHeaders = Object.keys(declared.headers ?? {}).map((name) => name.toLowerCase());
    for (const name of CHECKED_HEADERS)
      if (answer.headers.has(name) && !declaredHeaders.includes(name))
        problems.push(`${where}: ${name} not declared`);
    for (const [name, header] of Object.entries(declared.headers ?? {})) {
      const required = (header as { $ref?: string }).$ref?.endsWith("/X-Request-Id") || name === "ETag";
      if (required && !answer.headers.has(name))
        problems.push(`${where}: declares ${name} but did not send it`);
    }
    const schema = declared.content?.["application/json"]?.schema;
    if (schema && answer.headers.get("content-type")?.startsWith("application/json")) {
      const pointer = `/paths/${pointerSegment(template)}/${verb}/responses/${answer.status}/content/application~1json/schema`;
      let validate = this.validators.get(pointer);
      if (!validate) {
        validate = this.ajv.compile({ $ref: `doc#${pointer}` });
        this.validators.set(pointer, validate);
      }
      if (!validate(answer.body)) problems.push(`${where}: ${this.ajv.errorsText(validate.errors)}`);
      // Top-level members the schema does not name (a signed denial's signature beside `error`).
      const ref = schema.$ref as string | undefined;
      const resolved = ref ? this.doc.components.schemas[ref.replace("#/components/schemas/", "")] : schema;
      const named = Object.keys((resolved?.properties as Json | undefined) ?? {});
      if (answer.body && typeof answer.body === "object" && !Array.isArray(answer.body))
        for (const member of Object.keys(answer.body))
          if (!named.includes(member)) problems.push(`${where}: member ${member} not in the schema`);
    }
    return problems;
  }
}
