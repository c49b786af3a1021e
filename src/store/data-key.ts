import type { Database } from "bun:sqlite";
import type { SecretBox } from "../crypto/secret-box.ts";
import type { Environment } from "../domain/scopes.ts";
import { mailPayloadContext } from "../mail/outbox.ts";
import { apiKeyContext } from "../modules/billing/service.ts";
import { keyContext as licenseKeyContext } from "../modules/licenses/service.ts";
import { secretContext as totpContext } from "../modules/named-users/two-factor.ts";
import { urlContext as webhookUrlContext } from "../modules/webhooks/service.ts";

/**
 * One kind of value the store keeps encrypted with the keystore's data key: where it is, and the
 * context (SecretBox AAD) it was sealed under, the same functions the services seal with.
 */
export interface Sealed {
  table: string;
  column: string;
  /** The column the context is made from. */
  contextColumn: string;
  context: (key: string) => string;
}

export const SEALED: readonly Sealed[] = [
  { table: "licenses", column: "key_ciphertext", contextColumn: "id", context: licenseKeyContext },
  { table: "webhook_endpoints", column: "url_ciphertext", contextColumn: "id", context: webhookUrlContext },
  {
    table: "billing_integrations",
    column: "api_key_ciphertext",
    contextColumn: "environment",
    context: (environment) => apiKeyContext(environment as Environment),
  },
  { table: "license_users", column: "totp_secret", contextColumn: "id", context: totpContext },
  { table: "mail_outbox", column: "payload", contextColumn: "id", context: mailPayloadContext },
];

/** Values tried per kind: one damaged value must not pass for a wrong key. */
const TRIED_PER_KIND = 3;

/**
 * Whether the keystore's data key is the one the store's secrets were sealed with, tried on a few
 * values of each kind (indexed reads and a decryption each). AES-GCM authenticates: one value that
 * decrypts proves the key, and a wrong key decrypts none. A keystore from another install opens,
 * and may even hold every signing key the store lists, yet every read of a license would fail.
 * Returns the first value tried ("licenses.key_ciphertext of lic_…") when none decrypts; null when
 * one does, or when the store holds no encrypted value at all (nothing a data key could fail on).
 * Tables or columns a store of an older schema lacks are skipped.
 */
export function undecryptableValue(sqlite: Database, secrets: SecretBox): string | null {
  let first: string | null = null;
  for (const { table, column, contextColumn, context } of SEALED) {
    const columns = sqlite
      .query<{ name: string }, [string]>("SELECT name FROM pragma_table_info(?)")
      .all(table)
      .map((row) => row.name);
    if (!columns.includes(column) || !columns.includes(contextColumn)) continue;
    // Names from the constant list above, never from input.
    const rows = sqlite
      .query<{ key: string; sealed: string }, []>(
        `SELECT "${contextColumn}" AS key, "${column}" AS sealed FROM "${table}" WHERE "${column}" IS NOT NULL LIMIT ${TRIED_PER_KIND}`,
      )
      .all();
    for (const row of rows) {
      try {
        secrets.decrypt(row.sealed, context(row.key));
        return null;
      } catch {
        first ??= `${table}.${column} of ${row.key}`;
      }
    }
  }
  return first;
}
