import { integer } from "drizzle-orm/sqlite-core";

/** Timestamps are stored as Unix milliseconds and surface as Date. */
export const timestamp = (name: string) => integer(name, { mode: "timestamp_ms" });
