import { statSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { eq } from "drizzle-orm";
import type { Deps } from "../deps.ts";
import { parseDateTime } from "../domain/datetime.ts";
import { canonicalLicenseKey } from "../domain/license-key.ts";
import { AtomicFile, FileWriteError } from "../fs/atomic-file.ts";
import { DEFAULT_BODY_LIMIT, parseJsonBytes, tooLarge } from "../http/body.ts";
import { checkBody } from "../http/envelope.ts";
import { ApiError } from "../http/errors.ts";
import { type OfflineCertificateBody, OfflineCertificateCreate } from "../modules/offline/model.ts";
import { EXPIRES_AT_RULE } from "../modules/offline/request.ts";
import { createServices } from "../services.ts";
import { licenses } from "../store/schema/index.ts";
import { UsageError } from "./args.ts";
import { CliError, out } from "./console.ts";
import { readBoundedFile } from "./secrets.ts";
import {
  type Command,
  cliActor,
  JSON_OPTION,
  located,
  refuseDirectoryForm,
  serviceBaseUrl,
  withinDataDir,
  withKeystoreDeps,
} from "./shared.ts";

/**
 * The body the API route would take, from the device's request file, through the route's own
 * checks (docs/protocol.md §17: both run the same code): its size limit, the text checks of every
 * JSON body (UTF-8, repeated member names, NUL characters, lone surrogates) and its schema. A
 * refusal is the route's error, code included.
 */
function bodyFrom(requestBytes: Uint8Array, expiresAt: string | undefined): OfflineCertificateBody {
  // The route measures the whole body, `{"request":…}` around the file (and the expiry, if any).
  const envelope =
    `{"request":}`.length + (expiresAt === undefined ? 0 : `,"expires_at":""`.length + expiresAt.length);
  if (requestBytes.byteLength + envelope > DEFAULT_BODY_LIMIT) throw tooLarge(DEFAULT_BODY_LIMIT);
  const request = parseJsonBytes(requestBytes, "request");
  return checkBody(OfflineCertificateCreate, {
    request,
    ...(expiresAt === undefined ? {} : { expires_at: expiresAt }),
  });
}

/** The same file by device and inode, so links and other spellings count; by location if one is missing. */
function sameFile(a: string, b: string): boolean {
  try {
    const [first, second] = [statSync(a), statSync(b)];
    return first.dev === second.dev && first.ino === second.ino;
  } catch {
    return located(a) === located(b);
  }
}

/**
 * The package's destination, checked before anything is issued: replacing the request file loses
 * what the recovery advice says to run again with, replacing the passphrase file (often kept
 * outside the data directory) locks the keystore for good, and a file in the data directory may
 * be the keystore or the store, whose replacement destroys the install. `path` is resolved.
 */
function refuseOut(
  path: string,
  shown: string,
  requestPath: string,
  config: { dataDir: string; passphraseFile: string | null },
): void {
  if (sameFile(path, requestPath)) throw new CliError(`cannot write ${shown}: it is the request file`);
  if (config.passphraseFile && sameFile(path, config.passphraseFile))
    throw new CliError(`cannot write ${shown}: it is the keystore's passphrase file`);
  // The rename replaces the entry in the package's directory, so that directory decides. No data
  // directory: opening the keystore refuses that, and nothing in it can be replaced.
  if (withinDataDir(dirname(path), config.dataDir))
    throw new CliError(
      `cannot write ${shown}: it is in the data directory ${config.dataDir}, which holds only the service's own files`,
    );
}

const describe = (error: ApiError): string => {
  const fields = error.details.errors as Record<string, string[]> | undefined;
  const extra = fields
    ? `: ${Object.entries(fields)
        .map(([field, messages]) => `${field} ${messages.join(", ")}`)
        .join("; ")}`
    : Object.keys(error.details).length > 0
      ? ` (${JSON.stringify(error.details)})`
      : "";
  // "Some values are invalid." then ": request …" would read ".:".
  const message = extra.startsWith(":") ? error.message.replace(/\.$/, "") : error.message;
  return `${error.code}: ${message}${extra}`;
};

/**
 * The route answers 402 PLAN_ENDED once the workspace plan has ended, before it looks at the
 * license (spec §4.1); the command asks the route's own gate, at the same point.
 */
function refuseEndedPlan(services: ReturnType<typeof createServices>, deps: Deps, licenseId: string): void {
  try {
    services.planGate.admit("POST", `/mgmt/v1/licenses/${licenseId}/offline-certificates`, deps.clock.now());
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    const { plan, ended_at } = error.details as { plan?: string; ended_at?: string };
    throw new CliError(
      `${error.code}: ${error.message.replace(/\.$/, "")} (plan ${plan}, ended ${ended_at}); ` +
        'nothing is issued until "licensing plan set" gives the workspace a plan that has not ended',
    );
  }
}

/**
 * `licensing offline issue`: the API route's offline package, made from the data dir with no server
 * and no network (an air-gapped host). It runs the same service code, so the package and its audit
 * record are the route's; the actor is the operating-system user.
 */
export const offlineIssueCommand: Command = {
  name: "offline issue",
  summary:
    "Issue a device-bound offline package from the data directory, without a server or network (air-gapped). Certificates name the base URL the last server on this data directory ran with as their issuer, unless --base-url is given.",
  usage:
    "licensing offline issue --license ID --request FILE --out FILE.zip [--expires-at ISO] [--json] [--data-dir DIR] [--base-url URL]",
  configKeys: ["dataDir", "passphraseFile", "baseUrl"],
  options: [
    { name: "license", kind: "string", valueName: "ID", description: "the license (lic_…)" },
    {
      name: "request",
      kind: "string",
      valueName: "FILE",
      description: "the device's offline request (JSON, service-offline-request-v1)",
    },
    { name: "out", kind: "string", valueName: "FILE", description: "where to write the package (.zip)" },
    {
      name: "expires-at",
      kind: "string",
      valueName: "ISO",
      description: "package expiry (RFC 3339); default: the license's expiry, or the plan's longest license",
    },
    JSON_OPTION,
  ],
  run(line, context) {
    if (line.positionals.length > 0) throw new UsageError(`unexpected argument ${line.positionals[0]}`);
    const { license: licenseId, request: requestFile, out: outFile } = line.flags;
    if (typeof licenseId !== "string") throw new UsageError("--license is required");
    // The key instead of the id: "no license <key>" would put a live secret into terminals, logs
    // and CI output, as keys revoke avoids for API keys.
    if (canonicalLicenseKey(licenseId) !== null)
      throw new UsageError("--license: that looks like a license key; give the license's id (lic_…)");
    if (typeof requestFile !== "string") throw new UsageError("--request is required");
    if (typeof outFile !== "string") throw new UsageError("--out is required");
    const expiresAt = line.flags["expires-at"];
    // The route's own rule (requestedExpiry), checked here so a bad flag is a usage error, told
    // apart from a request file the route refuses (exit 1).
    if (typeof expiresAt === "string" && parseDateTime(expiresAt) === null)
      throw new UsageError(`--expires-at ${EXPIRES_AT_RULE}`);
    const requestPath = resolve(context.cwd, requestFile);
    let requestBytes: Uint8Array | null;
    try {
      // Bytes, not text: a "utf8" read would turn invalid UTF-8 into U+FFFD, which the route
      // refuses. No further than the route's limit: a huge file (or a device) is never held whole.
      requestBytes = readBoundedFile(requestPath, DEFAULT_BODY_LIMIT);
    } catch (error) {
      throw new CliError(`cannot read ${requestFile}: ${(error as Error).message}`);
    }
    if (requestBytes === null)
      throw new CliError(`${requestFile}: ${describe(tooLarge(DEFAULT_BODY_LIMIT))}`);
    let body: OfflineCertificateBody;
    try {
      body = bodyFrom(requestBytes, typeof expiresAt === "string" ? expiresAt : undefined);
    } catch (error) {
      if (error instanceof ApiError) throw new CliError(`${requestFile}: ${describe(error)}`);
      throw error;
    }
    refuseDirectoryForm(outFile);
    const outPath = resolve(context.cwd, outFile);
    refuseOut(outPath, outFile, requestPath, line.config);

    return withKeystoreDeps(line, (deps) => {
      // The issuer its certificates name: the server's own unless --base-url says otherwise.
      const services = createServices(deps, { baseUrl: serviceBaseUrl(line.config, deps) });
      refuseEndedPlan(services, deps, licenseId);
      const license = deps.db.select().from(licenses).where(eq(licenses.id, licenseId)).get();
      if (!license) throw new CliError(`no license ${licenseId}`);
      // The temp file is created before the package is issued: issuing takes a machine slot and
      // is audited, so a destination that cannot be written (no such directory, no permission, a
      // directory in its place) is refused while nothing has been issued yet.
      let file: AtomicFile;
      try {
        file = new AtomicFile(outPath);
      } catch (error) {
        if (error instanceof FileWriteError) throw new CliError(`cannot write ${outFile}: ${error.message}`);
        throw error;
      }
      const path = file.path;
      let issued: ReturnType<typeof services.offlinePackages.issue>;
      try {
        issued = services.offlinePackages.issue(license.id, body, {
          actor: cliActor(),
          environment: license.environment,
          requestId: null,
        });
      } catch (error) {
        file.discard();
        if (error instanceof ApiError) throw new CliError(describe(error));
        throw error;
      }
      try {
        file.write(issued.bytes);
        file.commit();
      } catch (error) {
        // The package is stored and its slot taken by now; the same request gives the same bytes
        // again (docs/api.md, offline packages), so the operator can repeat the command elsewhere.
        const same =
          typeof expiresAt === "string" ? "the same request file and --expires-at" : "the same request file";
        throw new CliError(
          `offline package ${issued.id} for license ${license.id} is issued but could not be written to ${path}: ` +
            `${(error as Error).message}. Run the command again with ${same} (and another --out if needed): ` +
            "it writes the same package and issues nothing new.",
        );
      }
      if (line.flags.json === true) {
        out(
          JSON.stringify({
            package_id: issued.id,
            license_id: license.id,
            out: path,
            bytes: issued.bytes.length,
            replayed: issued.replayed,
          }),
        );
      } else {
        out(
          `${issued.replayed ? "The package issued earlier for this identical request" : "Offline package"} ${issued.id} for license ${license.id} written to ${path} (${issued.bytes.length} bytes).`,
        );
      }
      return 0;
    });
  },
};

export const offlineCommands = [offlineIssueCommand];
