import { createHash, generateKeyPairSync, type KeyObject, randomBytes, sign } from "node:crypto";
import { canonicalize } from "../../src/crypto/jcs.ts";
import { publicKeyText, thumbprint } from "../../src/crypto/keys.ts";

export type DeviceAlg = "ed25519" | "p256";

const nonce = () => randomBytes(16).toString("base64url");

/**
 * A device as a product app would be: its own signing and KEM keys, building signed requests by
 * the contract (docs/protocol.md) with node:crypto, independent of the server's helpers.
 */
export class TestDevice {
  readonly signingPublic: string;
  readonly kemPublic: string;
  readonly thumbprint: string;
  private readonly signingKey: KeyObject;

  constructor(readonly alg: DeviceAlg = "ed25519") {
    const pair =
      alg === "ed25519" ? generateKeyPairSync("ed25519") : generateKeyPairSync("ec", { namedCurve: "P-256" });
    this.signingKey = pair.privateKey;
    this.signingPublic = publicKeyText(pair.publicKey);
    this.kemPublic = publicKeyText(generateKeyPairSync("ec", { namedCurve: "P-256" }).publicKey);
    this.thumbprint = thumbprint(this.signingPublic);
  }

  sign(message: string): string {
    const data = Buffer.from(message);
    const signature =
      this.alg === "ed25519"
        ? sign(null, data, this.signingKey)
        : sign("sha256", data, { key: this.signingKey, dsaEncoding: "ieee-p1363" });
    return signature.toString("base64url");
  }

  activationBody(input: {
    licenseKey: string;
    productId: string;
    machineInfo?: Record<string, unknown>;
    clientTime: number;
    extra?: Record<string, unknown>;
  }): Record<string, unknown> {
    const body: Record<string, unknown> = {
      license_key: input.licenseKey,
      product_id: input.productId,
      device_signing_public_key: this.signingPublic,
      device_kem_public_key: this.kemPublic,
      machine_info: input.machineInfo ?? { os: "linux", arch: "x64" },
      machine_signals: { hostname: "test-host" },
      app_version: "1.0.0",
      sdk_version: "test",
      client_time: input.clientTime,
      nonce: nonce(),
      ...input.extra,
    };
    body.device_proof = this.sign(`Service-Activation-Proof-v1\n${canonicalize(body)}`);
    return body;
  }

  /** The four device-proof headers for a request whose raw body is `bodyText`. */
  proofHeaders(
    method: string,
    pathAndQuery: string,
    activationId: string,
    bodyText: string,
    options: { timestamp: number; nonce?: string },
  ): Record<string, string> {
    const proofNonce = options.nonce ?? nonce();
    const bodyHash = createHash("sha256").update(bodyText).digest("hex");
    const message = `Service-Device-Proof-v1\n${method}\n${pathAndQuery}\n${activationId}\n${options.timestamp}\n${proofNonce}\n${bodyHash}`;
    return {
      "x-service-activation": activationId,
      "x-service-timestamp": String(options.timestamp),
      "x-service-nonce": proofNonce,
      "x-service-signature": this.sign(message),
    };
  }
}

export const freshNonce = nonce;
