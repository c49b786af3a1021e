import { Type } from "@sinclair/typebox";
import { DateTime, dataOf, listOf, NameField } from "../../http/schemas.ts";

const Environment = Type.Union([Type.Literal("live"), Type.Literal("test")]);
const Name = NameField();
const Code = Type.String({
  pattern: "^[a-z0-9][a-z0-9_-]{0,63}$",
  description: "Lower-case slug, unique within the environment.",
});
const Description = Type.String({ maxLength: 2000 });

export const ProductCreate = Type.Object(
  {
    name: Name,
    code: Code,
    description: Type.Optional(Description),
    environment: Type.Optional({
      ...Environment,
      description: "The API key's environment when left out; another one is 403 ENVIRONMENT_MISMATCH.",
    }),
  },
  { additionalProperties: false },
);

export const ProductUpdate = Type.Object(
  {
    name: Type.Optional(Name),
    code: Type.Optional(Code),
    description: Type.Optional(Description),
    environment: Type.Optional(Environment),
  },
  { additionalProperties: false },
);

export const Product = Type.Object({
  public_id: Type.String(),
  name: Type.String(),
  code: Type.String(),
  description: Type.String(),
  environment: Environment,
  status: Type.Union([Type.Literal("active"), Type.Literal("archived")]),
  trust_bundle_sequence: Type.Integer(),
  signing_status: Type.Union([Type.Literal("pending"), Type.Literal("ready")]),
  version: Type.Integer({ description: "Concurrency token: send it as If-Match." }),
  created_at: DateTime(),
  updated_at: DateTime(),
});

export const productModels = {
  "product.create": ProductCreate,
  "product.update": ProductUpdate,
  "product.response": dataOf(Product),
  "product.list": listOf(Product),
};

export type ProductCreateBody = typeof ProductCreate.static;
export type ProductUpdateBody = typeof ProductUpdate.static;
