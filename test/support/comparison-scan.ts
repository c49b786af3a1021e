/**
 * A small lexical review of TypeScript source for comparisons that could leak a secret through
 * timing: `===`, `!==`, `==`, `!=` and the string/buffer methods that compare (`equals`,
 * `includes`, `startsWith`, `Buffer.compare`, …) where an operand names secret material. Used by
 * test/unit/timing-safe.test.ts. Lexical on purpose: the repository has no TypeScript parser with
 * a stable API, and the code is formatted by biome, so operands are simple to delimit.
 */

/** Words that name secret material (whole words of an identifier: `tokenHash` is token + hash). */
const SECRET_WORDS = new Set([
  "secret",
  "secrets",
  "signature",
  "signatures",
  "sig",
  "hmac",
  "mac",
  "token",
  "tokens",
  "code",
  "codes",
  "hash",
  "hashes",
  "digest",
  "password",
  "passphrase",
  "otp",
  "totp",
  "recovery",
  "proof",
  "fingerprint",
  "lookup",
  "key",
  "apikey",
  "credential",
  "credentials",
]);
/**
 * A last word that makes the identifier about the secret rather than the secret itself:
 * `totpStatus`, `secretExpiresAt`, `signatures.length`, `keyId`.
 */
const METADATA_WORDS = new Set([
  "length",
  "size",
  "at",
  "status",
  "statuses",
  "id",
  "ids",
  "count",
  "kind",
  "type",
  "purpose",
  "context",
  "version",
  "attempts",
  "failures",
  "remaining",
  "hint",
  "prefix",
  "name",
  "index",
  "ms",
  "sec",
]);

/** A word that says the value is public whatever else the name holds: `publicKey`, `keyThumbprint`. */
const PUBLIC_WORDS = new Set(["public", "thumbprint"]);

export interface Comparison {
  file: string;
  line: number;
  /** `left op right`, whitespace collapsed: the key of the allow-list. */
  text: string;
}

/**
 * The source with comments blanked and the insides of string, template and regex literals
 * replaced by `_` (delimiters and `${…}` code kept), same length and same line breaks, so offsets
 * map back to lines and no operator inside a literal is mistaken for code.
 */
export function maskSource(source: string): string {
  const out = source.split("");
  const blank = (i: number) => {
    if (out[i] !== "\n") out[i] = " ";
  };
  const fill = (i: number) => {
    if (out[i] !== "\n") out[i] = "_";
  };
  // Each template substitution is a code frame counting its own braces.
  const frames: number[] = [];
  let i = 0;
  const n = source.length;
  const prevSignificant = (at: number): string => {
    let j = at - 1;
    while (j >= 0 && /\s/.test(out[j] as string)) j--;
    if (j < 0) return "";
    const word = /[\w$]+$/.exec(out.slice(Math.max(0, j - 10), j + 1).join(""))?.[0];
    return word ?? (out[j] as string);
  };
  const REGEX_AFTER = new Set(["return", "typeof", "case", "in", "of", "delete", "void", "throw", "new"]);
  const template = (): void => {
    // At the char after an opening backtick or after a substitution's closing brace.
    while (i < n) {
      const c = source[i];
      if (c === "\\") {
        fill(i);
        fill(i + 1);
        i += 2;
      } else if (c === "`") {
        i++;
        return;
      } else if (c === "$" && source[i + 1] === "{") {
        i += 2;
        frames.push(0);
        code();
      } else {
        fill(i);
        i++;
      }
    }
  };
  const code = (): void => {
    while (i < n) {
      const c = source[i] as string;
      const next = source[i + 1];
      if (c === "/" && next === "/") {
        while (i < n && source[i] !== "\n") blank(i++);
      } else if (c === "/" && next === "*") {
        const end = source.indexOf("*/", i + 2);
        const stop = end === -1 ? n : end + 2;
        while (i < stop) blank(i++);
      } else if (c === '"' || c === "'") {
        i++;
        while (i < n && source[i] !== c && source[i] !== "\n") {
          if (source[i] === "\\") fill(i++);
          fill(i++);
        }
        i++;
      } else if (c === "`") {
        i++;
        template();
      } else if (c === "/") {
        const before = prevSignificant(i);
        if (before === "" || /[(,=:[!&|?{};+\-*%<>~^]$/.test(before) || REGEX_AFTER.has(before)) {
          i++;
          let inClass = false;
          while (i < n && source[i] !== "\n") {
            const r = source[i];
            if (r === "\\") {
              fill(i++);
              fill(i++);
              continue;
            }
            if (r === "[") inClass = true;
            else if (r === "]") inClass = false;
            else if (r === "/" && !inClass) break;
            fill(i++);
          }
          i++;
        } else i++;
      } else if (c === "{") {
        if (frames.length > 0) frames[frames.length - 1] = (frames.at(-1) as number) + 1;
        i++;
      } else if (c === "}") {
        if (frames.length > 0) {
          if (frames.at(-1) === 0) {
            frames.pop();
            i++;
            return;
          }
          frames[frames.length - 1] = (frames.at(-1) as number) - 1;
        }
        i++;
      } else i++;
    }
  };
  code();
  return out.join("");
}

const OPENERS: Record<string, string> = { ")": "(", "]": "[", "}": "{" };
const CLOSERS: Record<string, string> = { "(": ")", "[": "]", "{": "}" };
const QUOTES = new Set(['"', "'", "`"]);

/** Index of the bracket matching the one at `at`, scanning in `step` direction over masked text. */
function matching(text: string, at: number, step: 1 | -1): number {
  const open = text[at] as string;
  const close = step === 1 ? CLOSERS[open] : OPENERS[open];
  let depth = 0;
  for (let j = at; j >= 0 && j < text.length; j += step) {
    const c = text[j] as string;
    if (QUOTES.has(c)) {
      // Masked literals hold no quotes of their kind, so the next one closes this literal.
      let k = j + step;
      while (k >= 0 && k < text.length && text[k] !== c) k += step;
      j = k;
    } else if (c === open) depth++;
    else if (c === close && --depth === 0) return j;
  }
  return step === 1 ? text.length - 1 : 0;
}

/** The operand that ends just before `end`: a member/call/index chain or a literal. */
export function operandBefore(text: string, end: number): string {
  let i = end - 1;
  while (i >= 0 && /\s/.test(text[i] as string)) i--;
  const last = i;
  while (i >= 0) {
    const c = text[i] as string;
    if (c === ")" || c === "]") i = matching(text, i, -1) - 1;
    else if (QUOTES.has(c)) i = text.lastIndexOf(c, i - 1) - 1;
    else if (/[\w$.]/.test(c)) i--;
    else if (c === "?" && text[i + 1] === ".") i--;
    else if (c === "!" && text[i + 1] !== "=" && /[\w$)\]]/.test(text[i - 1] ?? "")) i--;
    else if (/\s/.test(c)) {
      // A chain broken over lines continues with a leading `.` or `?.`.
      const rest = text.slice(i + 1, last + 1).trimStart();
      if (!rest.startsWith(".") && !rest.startsWith("?.")) break;
      i--;
    } else break;
  }
  return text.slice(i + 1, last + 1).trim();
}

/** The operand that starts at `start`: an optional prefix, then a chain or a literal. */
export function operandAfter(text: string, start: number): string {
  let i = start;
  while (i < text.length && /\s/.test(text[i] as string)) i++;
  const first = i;
  const prefix = /^(?:typeof\s+|await\s+|new\s+|!|-)*/.exec(text.slice(i))?.[0] ?? "";
  i += prefix.length;
  while (i < text.length) {
    const c = text[i] as string;
    if (c === "(" || c === "[") i = matching(text, i, 1) + 1;
    else if (QUOTES.has(c)) i = text.indexOf(c, i + 1) + 1;
    else if (/[\w$.]/.test(c)) i++;
    else if (c === "?" && text[i + 1] === ".") i += 2;
    else if (c === "!" && text[i + 1] !== "=" && /[\w$)\]]/.test(text[i - 1] ?? "")) i++;
    else if (/\s/.test(c)) {
      const rest = text.slice(i).trimStart();
      if (!rest.startsWith(".") || rest.startsWith("...")) break;
      i++;
    } else break;
  }
  return text.slice(first, i).trim();
}

const isLiteral = (operand: string) =>
  /^(["'`]).*\1$/s.test(operand) ||
  /^-?\d/.test(operand) ||
  /^(null|undefined|true|false|void 0)$/.test(operand) ||
  // A template whose substitutions are all masked out: a literal as far as timing goes.
  /^\[\]$|^\{\}$/.test(operand);

/** The words of the identifier an operand finally names: `row.tokenHash` → token, hash. */
export function finalWords(operand: string): string[] {
  let rest = operand.replace(/^(?:await\s+|new\s+|!|-)+/, "");
  if (/^typeof\s/.test(rest)) return [];
  for (;;) {
    rest = rest.replace(/[!\s]+$/, "");
    const tail = rest.at(-1);
    if (tail !== ")" && tail !== "]") break;
    const open = matching(rest, rest.length - 1, -1);
    if (open === 0) {
      // A parenthesised expression: what it names is inside.
      rest = rest.slice(1, -1).replace(/\s+as\s+[\w$.<>[\]|\s]+$/, "");
      continue;
    }
    rest = rest.slice(0, open);
  }
  const name = /[\w$]+$/.exec(rest)?.[0] ?? "";
  return name
    .replace(/([a-z0-9])([A-Z])/g, "$1 $2")
    .replace(/([A-Z]+)([A-Z][a-z])/g, "$1 $2")
    .split(/[\s_$]+/)
    .filter(Boolean)
    .map((word) => word.toLowerCase());
}

export function namesSecret(operand: string): boolean {
  if (isLiteral(operand)) return false;
  const words = finalWords(operand);
  // `keyIdOf(…)` names a key id.
  if (words.at(-1) === "of") words.pop();
  if (words.some((word) => PUBLIC_WORDS.has(word))) return false;
  const last = words.at(-1);
  if (last === undefined || METADATA_WORDS.has(last)) return false;
  return words.some((word) => SECRET_WORDS.has(word));
}

const collapse = (text: string) => text.replace(/\s+/g, " ");

/** Every comparison in `source` with an operand that names secret material and no literal side. */
export function secretComparisons(file: string, source: string): Comparison[] {
  const text = maskSource(source);
  const lineOf = (at: number) => text.slice(0, at).split("\n").length;
  const found: Comparison[] = [];
  for (const match of text.matchAll(/(?<![=!<>])(===|!==|==|!=)(?!=)/g)) {
    const at = match.index;
    const op = match[1] as string;
    const left = operandBefore(text, at);
    const right = operandAfter(text, at + op.length);
    if (isLiteral(left) || isLiteral(right) || left === "" || right === "") continue;
    if (!namesSecret(left) && !namesSecret(right)) continue;
    found.push({ file, line: lineOf(at), text: collapse(`${left} ${op} ${right}`) });
  }
  for (const match of text.matchAll(
    /(?:\.(equals|includes|indexOf|lastIndexOf|startsWith|endsWith|localeCompare)|\bBuffer\.(compare))\(/g,
  )) {
    const at = match.index;
    const method = (match[1] ?? match[2]) as string;
    const open = at + match[0].length - 1;
    const args = text.slice(open + 1, matching(text, open, 1));
    const operands = topLevelArguments(args).map((arg) => operandAfter(arg, 0));
    const receiver = match[2] ? "Buffer" : operandBefore(text, at);
    if (match[1]) operands.push(receiver);
    if (operands.some((operand) => isLiteral(operand) || operand === "")) continue;
    if (!operands.some(namesSecret)) continue;
    found.push({ file, line: lineOf(at), text: collapse(`${receiver}.${method}(${args})`) });
  }
  // Masked literal text in the reported operands is replaced by the source's own.
  return found.map((c) => ({ ...c, text: unmask(c, source, text) }));
}

/** `a, f(b, c), d` → `a`, `f(b, c)`, `d` (over masked text, so no comma inside a literal counts). */
function topLevelArguments(args: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let from = 0;
  for (let j = 0; j < args.length; j++) {
    const c = args[j] as string;
    if (c === "(" || c === "[" || c === "{") depth++;
    else if (c === ")" || c === "]" || c === "}") depth--;
    else if (c === "," && depth === 0) {
      parts.push(args.slice(from, j));
      from = j + 1;
    }
  }
  parts.push(args.slice(from));
  return parts.filter((part) => part.trim() !== "");
}

/** The reported text with each masked literal shown as written, so allow-list keys read naturally. */
function unmask(comparison: Comparison, source: string, masked: string): string {
  const start = masked.indexOf(comparison.text.split(" ")[0] as string, lineStart(masked, comparison.line));
  if (start === -1) return comparison.text;
  // Same offsets: find the collapsed text's span in the masked source, then read the source there.
  let j = start;
  let k = 0;
  const want = comparison.text;
  while (j < masked.length && k < want.length) {
    if (/\s/.test(masked[j] as string) && want[k] === " ") {
      while (j < masked.length && /\s/.test(masked[j] as string)) j++;
      k++;
    } else if (masked[j] === want[k]) {
      j++;
      k++;
    } else return comparison.text;
  }
  return collapse(source.slice(start, j));
}

function lineStart(text: string, line: number): number {
  let at = 0;
  for (let l = 1; l < line; l++) at = text.indexOf("\n", at) + 1;
  return at;
}
