import { type TLiteral, type TUnion, Type } from "@sinclair/typebox";

type Literals<T extends readonly string[]> = { -readonly [K in keyof T]: TLiteral<T[K]> };

/** A string enum as a union of literals: validated by TypeBox, listed as choices in OpenAPI. */
export const StringEnum = <const T extends readonly string[]>(values: T, description?: string) =>
  Type.Union(
    values.map((value) => Type.Literal(value)),
    description ? { description } : {},
  ) as unknown as TUnion<Literals<T>>;
