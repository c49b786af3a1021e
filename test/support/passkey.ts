import { createHash, generateKeyPairSync, type KeyObject, randomBytes, sign } from "node:crypto";

/**
 * A software WebAuthn authenticator, built from the spec (W3C WebAuthn L2 §6, CTAP2 CBOR) with
 * node:crypto and its own CBOR encoder, independent of the server's parser.
 */
type Cbor = number | string | Uint8Array | Cbor[] | Map<Cbor, Cbor> | boolean;

function head(major: number, length: number): Buffer {
  if (length < 24) return Buffer.from([(major << 5) | length]);
  if (length < 256) return Buffer.from([(major << 5) | 24, length]);
  if (length < 65536) return Buffer.from([(major << 5) | 25, length >> 8, length & 255]);
  const b = Buffer.alloc(5);
  b[0] = (major << 5) | 26;
  b.writeUInt32BE(length, 1);
  return b;
}

export function cbor(value: Cbor): Buffer {
  if (typeof value === "number") return value >= 0 ? head(0, value) : head(1, -1 - value);
  if (typeof value === "boolean") return Buffer.from([value ? 0xf5 : 0xf4]);
  if (typeof value === "string") {
    const bytes = Buffer.from(value, "utf8");
    return Buffer.concat([head(3, bytes.length), bytes]);
  }
  if (value instanceof Uint8Array) return Buffer.concat([head(2, value.length), value]);
  if (Array.isArray(value)) return Buffer.concat([head(4, value.length), ...value.map(cbor)]);
  return Buffer.concat([head(5, value.size), ...[...value].flatMap(([k, v]) => [cbor(k), cbor(v)])]);
}

const sha256 = (data: Uint8Array | string) => createHash("sha256").update(data).digest();
const b64u = (data: Uint8Array) => Buffer.from(data).toString("base64url");

export class SoftAuthenticator {
  readonly credentialId = randomBytes(32);
  private readonly privateKey: KeyObject;
  private readonly cose: Map<Cbor, Cbor>;
  signCount = 0;

  constructor(
    readonly alg: "ed25519" | "p256" = "p256",
    private readonly rpId = "licensing.test",
    private readonly origin = "http://licensing.test",
  ) {
    if (alg === "ed25519") {
      const pair = generateKeyPairSync("ed25519");
      this.privateKey = pair.privateKey;
      const x = Buffer.from(pair.publicKey.export({ format: "jwk" }).x as string, "base64url");
      this.cose = new Map<Cbor, Cbor>([
        [1, 1],
        [3, -8],
        [-1, 6],
        [-2, x],
      ]);
    } else {
      const pair = generateKeyPairSync("ec", { namedCurve: "P-256" });
      this.privateKey = pair.privateKey;
      const jwk = pair.publicKey.export({ format: "jwk" });
      this.cose = new Map<Cbor, Cbor>([
        [1, 2],
        [3, -7],
        [-1, 1],
        [-2, Buffer.from(jwk.x as string, "base64url")],
        [-3, Buffer.from(jwk.y as string, "base64url")],
      ]);
    }
  }

  get id(): string {
    return b64u(this.credentialId);
  }

  private authData(attested: boolean, flags = 0x05): Buffer {
    const counter = Buffer.alloc(4);
    counter.writeUInt32BE(this.signCount);
    const parts: Uint8Array[] = [sha256(this.rpId), Buffer.from([flags | (attested ? 0x40 : 0)]), counter];
    if (attested) {
      const length = Buffer.alloc(2);
      length.writeUInt16BE(this.credentialId.length);
      parts.push(Buffer.alloc(16), length, this.credentialId, cbor(this.cose));
    }
    return Buffer.concat(parts);
  }

  private clientData(type: string, challenge: string, overrides: Record<string, unknown> = {}): Buffer {
    return Buffer.from(
      JSON.stringify({ type, challenge, origin: this.origin, crossOrigin: false, ...overrides }),
    );
  }

  /** navigator.credentials.create(): the registration body fields. */
  create(challenge: string, overrides: Record<string, unknown> = {}) {
    const attestation = cbor(
      new Map<Cbor, Cbor>([
        ["fmt", "none"],
        ["attStmt", new Map()],
        ["authData", this.authData(true)],
      ]),
    );
    return {
      credential_id: this.id,
      client_data_json: b64u(this.clientData("webauthn.create", challenge, overrides)),
      attestation_object: b64u(attestation),
    };
  }

  /** navigator.credentials.get(): the approval body fields. */
  get(
    challenge: string,
    options: { clientData?: Record<string, unknown>; flags?: number; keepCounter?: boolean } = {},
  ) {
    if (!options.keepCounter) this.signCount++;
    const authenticatorData = this.authData(false, options.flags);
    const clientDataJson = this.clientData("webauthn.get", challenge, options.clientData);
    const signed = Buffer.concat([authenticatorData, sha256(clientDataJson)]);
    const signature =
      this.alg === "ed25519" ? sign(null, signed, this.privateKey) : sign("sha256", signed, this.privateKey);
    return {
      credential_id: this.id,
      client_data_json: b64u(clientDataJson),
      authenticator_data: b64u(authenticatorData),
      signature: b64u(signature),
    };
  }
}
