/** Plain-text tables for the bench output (and for docs/performance.md, which quotes them). */
export function table(headers: string[], rows: (string | number)[][], align?: ("l" | "r")[]): string {
  const cells = [headers, ...rows.map((row) => row.map(String))];
  const widths = headers.map((_, c) => Math.max(...cells.map((row) => (row[c] ?? "").length)));
  const line = (row: string[]) =>
    `| ${row
      .map((cell, c) =>
        (align?.[c] ?? (c === 0 ? "l" : "r")) === "l"
          ? cell.padEnd(widths[c] ?? 0)
          : cell.padStart(widths[c] ?? 0),
      )
      .join(" | ")} |`;
  const rule = `| ${widths.map((w, c) => ((align?.[c] ?? (c === 0 ? "l" : "r")) === "l" ? "-".repeat(w) : `${"-".repeat(Math.max(1, w - 1))}:`)).join(" | ")} |`;
  return [line(cells[0] as string[]), rule, ...cells.slice(1).map(line)].join("\n");
}

export const fixed = (value: number, digits = 0): string =>
  Number.isFinite(value) ? value.toFixed(digits) : "n/a";

export const thousands = (value: number): string =>
  Number.isFinite(value) ? Math.round(value).toLocaleString("en-US") : "n/a";

export const percent = (ratio: number): string =>
  Number.isFinite(ratio) ? `${(ratio * 100).toFixed(0)}%` : "n/a";
