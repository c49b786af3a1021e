import type { KeyObject } from "node:crypto";
import { sha256Hex } from "./encoding.ts";
import { canonicalize, quote } from "./jcs.ts";
import { signEd25519 } from "./keys.ts";

/** Signing-string prefixes of the contract (DESIGN §5). Never change one; add a -v2 instead. */
export const PREFIX = {
  trustBundle: "Service-Trust-Bundle-v1\n",
  response: "Service-Response-v1\n",
  delegation: "Service-Delegation-v1\n",
  activationProof: "Service-Activation-Proof-v1\n",
  trialProof: "Service-Trial-Proof-v1\n",
  offlineRequest: "Service-Offline-Request-v1\n",
  deviceProof: "Service-Device-Proof-v1\n",
  offlinePackage: "Service-Offline-Package-v1\n",
} as const;

export interface Delegation {
  v: 1;
  purpose: "runtime-response";
  product_id: string;
  parent_key_id: string;
  online_key_id: string;
  public_key: string;
  issued_at: number;
  expires_at: number;
}

export interface SignedDelegation {
  delegation: Delegation;
  signature: string;
}

/** An online key with the delegation that vouches for it; made once per product and period. */
export interface OnlineSigner {
  productId: string;
  keyId: string;
  parentKeyId: string;
  privateKey: KeyObject;
  delegation: SignedDelegation;
}

export interface ResponseAssertion {
  v: 1;
  product_id: string;
  key_id: string;
  parent_key_id: string;
  request_id: string;
  nonce: string;
  server_time: number;
  status: number;
  body_sha256: string;
}

export interface EnvelopeSignature {
  response_assertion: ResponseAssertion;
  response_signature: string;
  signing_delegation: SignedDelegation;
}

export const signDelegation = (delegation: Delegation, parentKey: KeyObject): SignedDelegation => ({
  delegation,
  signature: signEd25519(parentKey, PREFIX.delegation + canonicalize(delegation)),
});

interface SignInput {
  requestId: string;
  nonce: string;
  serverTime: number;
  status: number;
  body: unknown;
}

/**
 * Signs a runtime response: `body` is `data` for a success and the `error` object for a signed
 * denial; either way the hash covers its JCS form.
 */
export function signResponse(signer: OnlineSigner, input: SignInput): EnvelopeSignature {
  return signAssertion(signer, input, canonicalize(input.body)).signature;
}

/**
 * The whole JSON text of a signed success, `{ data, response_assertion, response_signature,
 * signing_delegation }`, from the JCS forms the signature needs anyway: JCS is JSON, so the data
 * and the assertion are not serialised a second time, and the delegation (the same for a whole
 * key period) is serialised once per period.
 */
export function signedResponseText(signer: OnlineSigner, input: SignInput): string {
  const dataText = canonicalize(input.body);
  const { signature, assertionText } = signAssertion(signer, input, dataText);
  let delegationText = delegationTexts.get(signer.delegation);
  if (delegationText === undefined) {
    delegationText = JSON.stringify(signer.delegation);
    delegationTexts.set(signer.delegation, delegationText);
  }
  return `{"data":${dataText},"response_assertion":${assertionText},"response_signature":"${signature.response_signature}","signing_delegation":${delegationText}}`;
}

const delegationTexts = new WeakMap<SignedDelegation, string>();

/** The assertion over a body's JCS text, its own JCS text, and its signature. */
function signAssertion(
  signer: OnlineSigner,
  input: SignInput,
  bodyText: string,
): { signature: EnvelopeSignature; assertionText: string } {
  const assertion: ResponseAssertion = {
    v: 1,
    product_id: signer.productId,
    key_id: signer.keyId,
    parent_key_id: signer.parentKeyId,
    request_id: input.requestId,
    nonce: input.nonce,
    server_time: input.serverTime,
    status: input.status,
    body_sha256: sha256Hex(bodyText),
  };
  const assertionText = assertionJcs(assertion);
  return {
    assertionText,
    signature: {
      response_assertion: assertion,
      response_signature: signEd25519(signer.privateKey, PREFIX.response + assertionText),
      signing_delegation: signer.delegation,
    },
  };
}

/**
 * The JCS text of an assertion, written out in its fixed key order (RFC 8785 sorts keys by UTF-16
 * code units: body_sha256, key_id, nonce, parent_key_id, product_id, request_id, server_time,
 * status, v). Every signed response makes one, so it skips the generic walk and the key sort;
 * test/unit/jcs-equivalence.test.ts holds it equal to the plain implementation.
 */
export function assertionJcs(a: ResponseAssertion): string {
  return `{"body_sha256":${quote(a.body_sha256)},"key_id":${quote(a.key_id)},"nonce":${quote(a.nonce)},"parent_key_id":${quote(a.parent_key_id)},"product_id":${quote(a.product_id)},"request_id":${quote(a.request_id)},"server_time":${canonicalize(a.server_time)},"status":${canonicalize(a.status)},"v":${canonicalize(a.v)}}`;
}
