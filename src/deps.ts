import type { Database } from "bun:sqlite";
import type { Keystore } from "./crypto/keystore.ts";
import type { SecretBox } from "./crypto/secret-box.ts";
import type { Clock } from "./domain/clock.ts";
import type { IdGenerator } from "./domain/ids.ts";
import type { Environment } from "./domain/scopes.ts";
import type { Db } from "./store/db.ts";
import type { Actor } from "./store/schema/index.ts";

/** What services need: plain values, no HTTP. Built once by server.ts (or a test) and passed down. */
export interface Deps {
  db: Db;
  sqlite: Database;
  clock: Clock;
  ids: IdGenerator;
  secrets: SecretBox;
  keystore: Keystore;
}

/** Who is making a change and on whose behalf, for the audit trail. */
export interface ChangeContext {
  actor: Actor;
  environment: Environment;
  requestId: string | null;
}
