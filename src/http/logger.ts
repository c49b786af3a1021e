/** One JSON object per line on stderr. Never give it secrets: callers pass only named fields. */
export type LogLevel = "debug" | "info" | "warn" | "error";

export interface Logger {
  log(level: LogLevel, msg: string, fields?: Record<string, unknown>): void;
}

const ORDER: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 };

export function jsonLogger(
  minimum: LogLevel = "info",
  write = (line: string) => process.stderr.write(line),
): Logger {
  return {
    log(level, msg, fields = {}) {
      if (ORDER[level] < ORDER[minimum]) return;
      write(`${JSON.stringify({ ts: new Date().toISOString(), level, msg, ...fields })}\n`);
    },
  };
}

export const silentLogger: Logger = { log() {} };
