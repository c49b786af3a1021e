/**
 * A fake licensing server as an injectable fetch. It verifies what the client sends (activation
 * proof and device-proof headers, with node:crypto and its own construction of the signed
 * strings) and answers with envelopes signed by an Authority. Tests steer it with `handlers`
 * (answer a request themselves), `sign` (pre-sign overrides) and `mutate` (post-sign tampering).
 */

import type { RequestInitLike, ResponseLike } from "../../../src/sdk/index.ts";
import { canonicalize } from "../../../src/sdk/index.ts";
import { Authority, type Json, T0 } from "./authority.ts";
import { nodeSha256Hex, nodeVerify } from "./node-crypto.ts";

export interface SeenRequest {
  method: string;
  url: string;
  path: string;
  headers: Record<string, string>;
  body: string | undefined;
  json: Json | undefined;
}

export interface FakeResponse {
  status: number;
  body?: unknown;
  headers?: Record<string, string>;
}

type SignOptions = Parameters<Authority["envelope"]>[1];

export class FakeServer {
  readonly authority: Authority;
  readonly requests: SeenRequest[] = [];
  /** Problems found in what the client sent; tests expect this to stay empty. */
  readonly proofFailures: string[] = [];
  /** Checked first, in order; a handler returning a response answers the request. */
  handlers: ((req: SeenRequest) => FakeResponse | undefined)[] = [];
  /** Pre-sign overrides of the next signed responses. */
  sign: (req: SeenRequest) => Partial<SignOptions> = () => ({});
  /** Post-sign tampering of signed responses. */
  mutate: (envelope: Json, req: SeenRequest) => Json = (e) => e;
  serverTime = T0;
  bundleData: () => Json;
  activations = new Map<string, { publicKey: string; machineInfo: Json }>();
  certificateClaims: Json = {};
  heartbeatInterval = 900;
  licenseStatus = "active";
  private counter = 0;

  constructor(authority = new Authority()) {
    this.authority = authority;
    this.bundleData = () => this.authority.signedBundle();
  }

  fetch = async (url: string, init: RequestInitLike): Promise<ResponseLike> => {
    const u = new URL(url);
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(init.headers)) headers[k.toLowerCase()] = v;
    let json: Json | undefined;
    if (init.body !== undefined) json = JSON.parse(init.body) as Json;
    const req: SeenRequest = {
      method: init.method,
      url,
      path: u.pathname + u.search,
      headers,
      body: init.body,
      json,
    };
    this.requests.push(req);
    const res = this.handle(req);
    const h = new Headers({ "content-type": "application/json", ...res.headers });
    return new Response(res.body === undefined ? "" : JSON.stringify(res.body), {
      status: res.status,
      headers: h,
    });
  };

  signed(
    req: SeenRequest,
    payload: unknown,
    status: number,
    nonce: string,
    field: "data" | "error" = "data",
  ) {
    const env = this.authority.envelope(payload, {
      nonce,
      status,
      serverTime: this.serverTime,
      field,
      ...this.sign(req),
    });
    return { status, body: this.mutate(env, req) };
  }

  /** An unsigned error envelope. */
  static error(
    status: number,
    code: string,
    extra: Partial<Json> = {},
    headers?: Record<string, string>,
  ): FakeResponse {
    return {
      status,
      body: {
        error: {
          code,
          message: code.toLowerCase(),
          request_id: "req_err",
          retryable: false,
          doc_url: `https://licensing.example.test/docs/errors#${code}`,
          details: {},
          ...extra,
        },
      },
      ...(headers ? { headers } : {}),
    };
  }

  /**
   * A signed license-state denial naming whom it is for as the server does (protocol §16): the
   * proof's activation, or the device key of an activation request; `details` replaces that.
   */
  denial(
    req: SeenRequest,
    status: number,
    code: string,
    details: Json = FakeServer.subjectOf(req),
  ): FakeResponse {
    const error = {
      code,
      message: code,
      request_id: "req_denial",
      retryable: false,
      doc_url: "x",
      details,
    };
    return this.signed(req, error, status, this.nonceOf(req), "error");
  }

  static subjectOf(req: SeenRequest): Json {
    const activationId = req.headers["x-service-activation"];
    if (activationId !== undefined) return { activation_id: activationId };
    const key = req.json?.device_signing_public_key;
    return typeof key === "string" ? { device_thumbprint: nodeSha256Hex(key) } : {};
  }

  nonceOf(req: SeenRequest): string {
    return (req.json?.nonce as string | undefined) ?? req.headers["x-service-nonce"] ?? "";
  }

  private handle(req: SeenRequest): FakeResponse {
    for (const h of this.handlers) {
      const res = h(req);
      if (res) return res;
    }
    const p = req.path;
    if (req.method === "GET" && p === `/runtime/v1/products/${this.authority.productId}/trust-bundle`) {
      return { status: 200, body: { data: this.bundleData() } };
    }
    if (req.method === "POST" && p === "/runtime/v1/time") {
      const iso = new Date(this.serverTime * 1000).toISOString().replace(".000Z", "Z");
      return this.signed(req, iso, 200, this.nonceOf(req));
    }
    if (req.method === "POST" && p === "/runtime/v1/activations") return this.activate(req);
    const hb = p.match(/^\/runtime\/v1\/activations\/([^/]+)\/heartbeat$/);
    if (req.method === "POST" && hb) return this.heartbeat(req, hb[1]!);
    const del = p.match(/^\/runtime\/v1\/activations\/([^/]+)$/);
    if (req.method === "DELETE" && del) {
      if (!this.checkDeviceProof(req, del[1]!)) return FakeServer.error(401, "DEVICE_PROOF_INVALID");
      this.activations.delete(del[1]!);
      return this.signed(req, "deactivated", 200, this.nonceOf(req));
    }
    if (p.startsWith("/runtime/v1/leases")) return this.lease(req);
    return FakeServer.error(404, "NOT_FOUND");
  }

  private activate(req: SeenRequest): FakeResponse {
    const body = req.json!;
    const key = req.headers["idempotency-key"] ?? "";
    if (key.length < 16 || key.length > 255) this.proofFailures.push("idempotency key length");
    const { device_proof, ...rest } = body;
    const message = `Service-Activation-Proof-v1\n${canonicalize(rest)}`;
    if (!nodeVerify(body.device_signing_public_key as string, message, device_proof as string)) {
      this.proofFailures.push("activation proof");
      return FakeServer.error(401, "DEVICE_PROOF_INVALID");
    }
    // As the server does (protocol §11): a device key with an active activation gets that one back.
    const existing = [...this.activations].find(([, a]) => a.publicKey === body.device_signing_public_key);
    const activationId = existing?.[0] ?? `act_${String(++this.counter).padStart(26, "0")}`;
    this.activations.set(activationId, {
      publicKey: body.device_signing_public_key as string,
      machineInfo: body.machine_info as Json,
    });
    const digest = nodeSha256Hex(canonicalize(body.machine_info));
    const certificate = this.certificateFor(activationId, digest);
    return this.signed(
      req,
      { activation_id: activationId, certificate, machine_info_digest: digest },
      201,
      body.nonce as string,
    );
  }

  certificateFor(activationId: string, digest: string): string {
    const act = this.activations.get(activationId)!;
    return this.authority.certificate({
      jkt: nodeSha256Hex(act.publicKey),
      activationId,
      claims: {
        machine_info_digest: digest,
        iat: this.serverTime,
        nbf: this.serverTime,
        exp: this.serverTime + 86_400,
        ...this.certificateClaims,
      },
    });
  }

  /** Independent construction and check of the device-proof headers. */
  checkDeviceProof(req: SeenRequest, activationId: string): boolean {
    const act = this.activations.get(activationId);
    const h = req.headers;
    const problems: string[] = [];
    if (!act) problems.push("unknown activation");
    if (h["x-service-activation"] !== activationId) problems.push("activation header");
    if (!/^\d+$/.test(h["x-service-timestamp"] ?? "")) problems.push("timestamp header");
    if (!/^[A-Za-z0-9_-]{22,255}$/.test(h["x-service-nonce"] ?? "")) problems.push("nonce header");
    const message = [
      "Service-Device-Proof-v1",
      req.method,
      req.path,
      activationId,
      h["x-service-timestamp"],
      h["x-service-nonce"],
      nodeSha256Hex(req.body ?? ""),
    ].join("\n");
    if (act && !nodeVerify(act.publicKey, message, h["x-service-signature"] ?? ""))
      problems.push("signature");
    this.proofFailures.push(...problems.map((p) => `${req.method} ${req.path}: ${p}`));
    return problems.length === 0;
  }

  private heartbeat(req: SeenRequest, activationId: string): FakeResponse {
    if (!this.checkDeviceProof(req, activationId)) return FakeServer.error(401, "DEVICE_PROOF_INVALID");
    const body = req.json!;
    let digest = body.machine_info_digest as string | undefined;
    if (body.machine_info !== undefined) digest = nodeSha256Hex(canonicalize(body.machine_info));
    const data = {
      activation_id: activationId,
      license_status: this.licenseStatus,
      certificate: this.certificateFor(activationId, digest ?? ""),
      next_heartbeat_in: this.heartbeatInterval,
      machine_info_digest: digest,
    };
    return this.signed(req, data, 200, this.nonceOf(req));
  }

  private lease(req: SeenRequest): FakeResponse {
    const activationId = req.headers["x-service-activation"] ?? "";
    if (!this.checkDeviceProof(req, activationId)) return FakeServer.error(401, "DEVICE_PROOF_INVALID");
    const body = req.json ?? {};
    const nonce = this.nonceOf(req);
    if (req.method === "POST" && req.path === "/runtime/v1/leases") {
      const data = {
        lease_id: `lse_${++this.counter}`,
        activation_id: activationId,
        instance_id: body.instance_id,
        expires_at: this.serverTime + 300,
        heartbeat_in: 60,
      };
      return this.signed(req, data, 201, nonce);
    }
    const hb = req.path.match(/^\/runtime\/v1\/leases\/([^/]+)\/heartbeat$/);
    if (req.method === "POST" && hb) {
      const data = {
        lease_id: hb[1],
        activation_id: activationId,
        instance_id: body.instance_id,
        expires_at: this.serverTime + 300,
        heartbeat_in: 60,
      };
      return this.signed(req, data, 200, nonce);
    }
    const del = req.path.match(/^\/runtime\/v1\/leases\/([^/]+)$/);
    if (req.method === "DELETE" && del)
      return this.signed(
        req,
        { lease_id: del[1], activation_id: activationId, status: "released" },
        200,
        nonce,
      );
    return FakeServer.error(404, "NOT_FOUND");
  }
}
