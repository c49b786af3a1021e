import { existsSync, realpathSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { parseSealingKeyLine, SEALING_KEY_PREFIX, sealFile } from "../crypto/sealed-file.ts";
import { ENTITLEMENT_NAME, ENTITLEMENT_NAME_RULE } from "../domain/entitlements.ts";
import { FileWriteError, removeTempFilesOnSignals, systemDescription } from "../fs/atomic-file.ts";
import { UsageError } from "./args.ts";
import { CliError, out } from "./console.ts";
import { type Command, JSON_OPTION, refuseDirectoryForm } from "./shared.ts";

/**
 * Where the line to paste is, for a value that is not one at all. The sealed-files status shows
 * `public_key` (`p256:…`) beside `sealing_key`, and the bare point is the one pasted by mistake.
 */
function whereTheLineIs(given: string): string {
  const text = given.trim();
  if (text.startsWith(SEALING_KEY_PREFIX)) return "";
  const where =
    "current_key.sealing_key of the product's sealed-files status (GET /mgmt/v1/products/{id}/sealed-files), " +
    "or the line licensing sealing-keys list prints";
  return text.startsWith("p256:")
    ? `; that is the key's public_key: give its sealing_key line instead, ${where}`
    : `; give ${where}`;
}

/**
 * `licensing seal`: seals a file for a product's licensed devices. It needs nothing but the
 * public sealing-key line: no data dir, no keystore, no network, so it runs on a build machine.
 */
export const sealCommand: Command = {
  name: "seal",
  summary:
    "Seal a file so that only licensed devices can open it. Streams: memory use does not grow with the file. Needs only the product's public sealing key (GET /mgmt/v1/products/{id}/sealed-files, current_key.sealing_key).",
  usage: "licensing seal --sealing-key LINE [--entitlement NAME] [--json] IN OUT",
  configKeys: [],
  options: [
    {
      name: "sealing-key",
      kind: "string",
      valueName: "LINE",
      description: "the product's sealing key line, service-sealing-key-v1:…",
    },
    {
      name: "entitlement",
      kind: "string",
      valueName: "NAME",
      description: "devices also need this entitlement to be true for their license",
    },
    JSON_OPTION,
  ],
  async run(line, context) {
    const [input, output, extra] = line.positionals;
    if (input === undefined || output === undefined) throw new UsageError("give the input and output files");
    if (extra !== undefined) throw new UsageError(`unexpected argument ${extra}`);
    const keyLine = line.flags["sealing-key"];
    if (typeof keyLine !== "string") throw new UsageError("--sealing-key is required");
    const entitlement = line.flags.entitlement;
    // sealFile refuses it too, but as a failure (exit 1) and only after the files were opened.
    if (typeof entitlement === "string" && !ENTITLEMENT_NAME.test(entitlement))
      throw new UsageError(`--entitlement must be ${ENTITLEMENT_NAME_RULE}`);
    let key: ReturnType<typeof parseSealingKeyLine>;
    try {
      key = parseSealingKeyLine(keyLine);
    } catch (error) {
      throw new UsageError(`--sealing-key: ${(error as Error).message}${whereTheLineIs(keyLine)}`);
    }
    refuseDirectoryForm(output);
    const inPath = resolve(context.cwd, input);
    const outPath = resolve(context.cwd, output);
    if (!existsSync(inPath)) throw new CliError(`cannot read ${input}: no such file`);
    if (statSync(inPath).isDirectory()) throw new CliError(`cannot read ${input}: it is a directory`);
    if (existsSync(outPath) && realpathSync(outPath) === realpathSync(inPath))
      throw new CliError("the output must be another file than the input");
    let result: Awaited<ReturnType<typeof sealFile>>;
    // Ctrl-C, SIGTERM, SIGHUP or SIGQUIT half-way through a large file removes the partial output.
    const stopRemovingOnSignals = removeTempFilesOnSignals("licensing seal");
    try {
      result = await sealFile(inPath, outPath, key, typeof entitlement === "string" ? { entitlement } : {});
    } catch (error) {
      if (error instanceof FileWriteError) throw new CliError(`cannot write ${output}: ${error.message}`);
      // The input's own failures (permission denied) in words; Node's message names the call.
      if (typeof (error as NodeJS.ErrnoException).code === "string")
        throw new CliError(`cannot read ${input}: ${systemDescription(error)}`);
      throw new CliError(`cannot seal ${input}: ${(error as Error).message}`);
    } finally {
      stopRemovingOnSignals();
    }
    if (line.flags.json === true) {
      out(
        JSON.stringify({
          file_id: result.header.file_id,
          product_id: result.header.product_id,
          key_id: result.header.key_id,
          entitlement: result.header.entitlement ?? null,
          header_sha256: result.headerSha256,
          plaintext_bytes: result.plaintextBytes,
          chunks: result.chunks,
        }),
      );
    } else {
      out(
        `Sealed ${input} to ${output}: file ${result.header.file_id}, ${result.plaintextBytes} bytes in ${result.chunks} chunk(s), for product ${result.header.product_id}${result.header.entitlement ? ` with entitlement ${result.header.entitlement}` : ""}.`,
      );
    }
    return 0;
  },
};
