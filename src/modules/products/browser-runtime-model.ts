import { Type } from "@sinclair/typebox";
import { dataOf } from "../../http/schemas.ts";
import { MAX_ALLOWED_ORIGINS } from "./browser-origins.ts";

const Origins = Type.Array(Type.String({ maxLength: 300 }), {
  maxItems: MAX_ALLOWED_ORIGINS,
  description:
    "Replaces the whole list. Exact origins (scheme://host[:port]); https, or http on a loopback host for test products. Stored and returned in canonical form.",
});

export const BrowserRuntimeUpdate = Type.Object(
  {
    enabled: Type.Optional(Type.Boolean({ description: "Disabling keeps the list." })),
    allowed_origins: Type.Optional(Origins),
  },
  { additionalProperties: false },
);

export const BrowserRuntime = Type.Object({
  product_id: Type.String(),
  enabled: Type.Boolean(),
  allowed_origins: Type.Array(Type.String()),
  version: Type.Integer({ description: "The product's version: send it as If-Match." }),
});

export const browserRuntimeModels = {
  "browser-runtime.update": BrowserRuntimeUpdate,
  "browser-runtime.response": dataOf(BrowserRuntime),
};

export type BrowserRuntimeUpdateBody = typeof BrowserRuntimeUpdate.static;
