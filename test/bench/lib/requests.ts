import { createHash, createPrivateKey, type KeyObject, randomBytes, sign } from "node:crypto";
import { writeFileSync } from "node:fs";
import { machineInfoDigest } from "../../../src/modules/activations/machine.ts";
import { TestDevice } from "../../support/device.ts";

/** One HTTP request as the load generators replay it. */
export interface BenchRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: string;
}

/** Anything that signs with a device key (TestDevice, or a seeded device rebuilt from its seed). */
export interface Signer {
  sign(message: string): string;
}

/** A device the bench holds the key of, and the activation the server gave it. */
export interface BenchDevice {
  signer: Signer;
  activationId: string;
}

export const MACHINE_INFO = { os: "linux", arch: "x64" } as const;
export const MACHINE_DIGEST = machineInfoDigest({ ...MACHINE_INFO });

export const nonce = (): string => randomBytes(16).toString("base64url");
export const nowSec = (): number => Math.floor(Date.now() / 1000);

/** An Ed25519 device key rebuilt from its 32-byte seed (seeded devices keep only the seed). */
export class SeedSigner implements Signer {
  private key: KeyObject | undefined;
  constructor(private readonly seed: Uint8Array) {}
  sign(message: string): string {
    this.key ??= createPrivateKey({
      key: Buffer.concat([Buffer.from("302e020100300506032b657004220420", "hex"), this.seed]),
      format: "der",
      type: "pkcs8",
    });
    return sign(null, Buffer.from(message), this.key).toString("base64url");
  }
}

/** The device-proof headers of docs/protocol.md §9. */
export function proofHeaders(
  signer: Signer,
  method: string,
  path: string,
  activationId: string,
  body: string,
  timestamp: number,
): Record<string, string> {
  const proofNonce = nonce();
  const bodyHash = createHash("sha256").update(body).digest("hex");
  const message = `Service-Device-Proof-v1\n${method}\n${path}\n${activationId}\n${timestamp}\n${proofNonce}\n${bodyHash}`;
  return {
    "x-service-activation": activationId,
    "x-service-timestamp": String(timestamp),
    "x-service-nonce": proofNonce,
    "x-service-signature": signer.sign(message),
  };
}

function deviceProofRequest(
  device: BenchDevice,
  method: string,
  path: string,
  payload: unknown,
  timestamp: number,
): BenchRequest {
  const body = JSON.stringify(payload);
  return {
    method,
    path,
    headers: {
      "content-type": "application/json",
      ...proofHeaders(device.signer, method, path, device.activationId, body, timestamp),
    },
    body,
  };
}

export const heartbeatRequest = (device: BenchDevice, timestamp = nowSec()): BenchRequest =>
  deviceProofRequest(
    device,
    "POST",
    `/runtime/v1/activations/${device.activationId}/heartbeat`,
    { machine_info_digest: MACHINE_DIGEST },
    timestamp,
  );

export const leaseAcquireRequest = (device: BenchDevice, instanceId: string, timestamp = nowSec()) =>
  deviceProofRequest(
    device,
    "POST",
    "/runtime/v1/leases",
    { activation_id: device.activationId, instance_id: instanceId },
    timestamp,
  );

export const leaseHeartbeatRequest = (
  device: BenchDevice,
  leaseId: string,
  instanceId: string,
  timestamp = nowSec(),
) =>
  deviceProofRequest(
    device,
    "POST",
    `/runtime/v1/leases/${leaseId}/heartbeat`,
    { instance_id: instanceId },
    timestamp,
  );

export const leaseReleaseRequest = (
  device: BenchDevice,
  leaseId: string,
  instanceId: string,
  timestamp = nowSec(),
) =>
  deviceProofRequest(
    device,
    "DELETE",
    `/runtime/v1/leases/${leaseId}`,
    { instance_id: instanceId },
    timestamp,
  );

let idempotencyCounter = 0;

/** A new device's activation: fresh signing and KEM keys, the proof, a unique Idempotency-Key. */
export function activationRequest(
  licenseKey: string,
  productId: string,
  clientTime = nowSec(),
): { request: BenchRequest; device: TestDevice } {
  const device = new TestDevice("ed25519");
  const body = JSON.stringify(
    device.activationBody({ licenseKey, productId, clientTime, machineInfo: { ...MACHINE_INFO } }),
  );
  return {
    device,
    request: {
      method: "POST",
      path: "/runtime/v1/activations",
      headers: {
        "content-type": "application/json",
        "idempotency-key": `bench-${process.pid}-${++idempotencyCounter}-${nonce()}`,
      },
      body,
    },
  };
}

export const timeRequest = (productId: string): BenchRequest => ({
  method: "POST",
  path: "/runtime/v1/time",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ product_id: productId, nonce: nonce() }),
});

export const managementListRequest = (apiKey: string, path = "/mgmt/v1/licenses"): BenchRequest => ({
  method: "GET",
  path,
  headers: { authorization: `Bearer ${apiKey}` },
  body: "",
});

/** The replay format of replay.lua and open-loop.ts: METHOD \t PATH \t name: value|... \t BODY. */
export function requestLine(request: BenchRequest): string {
  const headers = Object.entries(request.headers).map(([name, value]) => {
    if (/[\t\n|]/.test(name + value)) throw new Error(`header ${name} cannot be written to a request file`);
    return `${name}: ${value}`;
  });
  if (/[\t\n]/.test(request.method + request.path + request.body)) {
    throw new Error("a request with a tab or newline cannot be written to a request file");
  }
  return `${request.method}\t${request.path}\t${headers.join("|")}\t${request.body}`;
}

export function parseRequestLine(line: string): BenchRequest {
  const [method = "", path = "", headerText = "", ...rest] = line.split("\t");
  const headers: Record<string, string> = {};
  for (const pair of headerText.split("|")) {
    if (!pair) continue;
    const colon = pair.indexOf(":");
    headers[pair.slice(0, colon)] = pair.slice(colon + 1).trim();
  }
  return { method, path, headers, body: rest.join("\t") };
}

export function writeRequestFile(path: string, requests: Iterable<BenchRequest>): number {
  const lines: string[] = [];
  for (const request of requests) lines.push(requestLine(request));
  writeFileSync(path, `${lines.join("\n")}\n`);
  return lines.length;
}

/** One of `items` at random (devices, license keys, leases of a run). */
export const pickFrom = <T>(items: T[]): T => items[Math.floor(Math.random() * items.length)] as T;
