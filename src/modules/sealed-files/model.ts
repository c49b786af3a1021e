import { Type } from "@sinclair/typebox";
import { MAX_HEADER_LINE_BYTES } from "../../crypto/sealed-file.ts";
import { RUNTIME_BODY_LIMIT } from "../../http/body.ts";
import { DateTime, dataOf, IdField } from "../../http/schemas.ts";
import { StringEnum } from "../../http/schemas-enum.ts";
import { SEALING_KEY_STATUSES } from "../../store/schema/index.ts";
import { signed } from "../activations/model.ts";

export const SEALED_FILE_STATUSES = ["enabled", "disabled", "not_entitled", "unavailable"] as const;

export const SealedFileStatus = Type.Object({
  product_id: Type.String(),
  status: StringEnum(
    SEALED_FILE_STATUSES,
    "enabled: a key exists and devices get file keys; disabled: no key yet; not_entitled: the plan lacks sealed_files (an existing key stays, devices get no file keys); unavailable: this environment does not offer sealed files.",
  ),
  current_key: Type.Union(
    [
      Type.Object({
        key_id: Type.String(),
        public_key: Type.String({ description: "p256:<b64u 65-byte uncompressed point>" }),
        sealing_key: Type.String({
          description:
            "One public line for `licensing seal --sealing-key`: service-sealing-key-v1:<product_id>:<key_id>:<b64u point>.",
        }),
        created_at: DateTime(),
      }),
      Type.Null(),
    ],
    {
      description:
        "The key new files are sealed to (`licensing sealing-keys rotate` replaces it); null until sealed files are enabled.",
    },
  ),
  keys: Type.Array(
    Type.Object({
      key_id: Type.String(),
      status: StringEnum(
        SEALING_KEY_STATUSES,
        "active: releases the data keys of files sealed to it; retired: no longer does (`retired_key`); compromised: never again, and its private half is gone from the keystore (`compromised_key`).",
      ),
      current: Type.Boolean({ description: "Whether this is `current_key`." }),
      public_key: Type.String({ description: "p256:<b64u 65-byte uncompressed point>" }),
      sealing_key: Type.String({
        description: "The key's public line. Seal new files to `current_key.sealing_key` only.",
      }),
      created_at: DateTime(),
      retired_at: Type.Union([DateTime(), Type.Null()], {
        description: "When it stopped releasing data keys.",
      }),
    }),
    { description: "Every sealing key the product has had, newest first." },
  ),
});

export const SealedFileKeyRequest = Type.Object(
  {
    // Only a bound for the schema: the line's own limit (4096 UTF-8 bytes) is the header check's,
    // which answers SEALED_FILE_INVALID like the header's other defects. The 16 KiB runtime body
    // limit comes first anyway.
    header: Type.String({
      minLength: 1,
      maxLength: RUNTIME_BODY_LIMIT,
      description: `The sealed file's header line: the text between \`SVCSEAL1\\n\` and the next newline, at most ${MAX_HEADER_LINE_BYTES} bytes as UTF-8 (longer is 422 SEALED_FILE_INVALID, reason invalid_header).`,
    }),
    sdk_version: Type.Optional(IdField()),
  },
  { additionalProperties: false },
);

export const SealedFileKeyResult = signed({
  activation_id: Type.String(),
  file_id: Type.String(),
  header_sha256: Type.String({ description: "hex SHA-256 of the header line's bytes." }),
  enc: Type.String({ description: "b64u HPKE encapsulated key (65 bytes)." }),
  wrapped_key: Type.String({
    description: "b64u of the data key sealed to the activation's KEM key (48 bytes).",
  }),
});

export const sealedFileModels = {
  "sealed-files.response": dataOf(SealedFileStatus),
};

export const sealedFileKeyModels = {
  "sealed-file-key.request": SealedFileKeyRequest,
  "sealed-file-key.result": SealedFileKeyResult,
};

export type SealedFileKeyBody = typeof SealedFileKeyRequest.static;
