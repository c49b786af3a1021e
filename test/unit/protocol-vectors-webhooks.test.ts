import { describe, expect, test } from "bun:test";
import { Webhook } from "standardwebhooks";
import { SECRET_PREFIX, signatureHeaders, signPayload } from "../../src/modules/webhooks/signing.ts";
import { vector as protocolVector } from "../support/protocol-vectors.ts";

/**
 * The `webhook-delivery` vector of docs/protocol.md §22, recomputed with the server's signer and
 * checked against the `standardwebhooks` reference implementation, which receivers use.
 */
const vector = protocolVector<Record<string, string>>("webhook-delivery");

describe("webhook-delivery vector", () => {
  test("exists", () => {
    expect(vector).toBeDefined();
  });

  test("the signed content is id.timestamp.body", () => {
    expect(vector.signed_content).toBe(`${vector.webhook_id}.${vector.webhook_timestamp}.${vector.body}`);
  });

  test("the server's signature matches the vector and the reference implementation's", () => {
    const timestamp = Number(vector.webhook_timestamp);
    expect(
      signPayload(vector.secret as string, vector.webhook_id as string, timestamp, vector.body as string),
    ).toBe(vector.webhook_signature as string);
    const reference = new Webhook(vector.secret as string).sign(
      vector.webhook_id as string,
      new Date(timestamp * 1000),
      vector.body as string,
    );
    expect(reference).toBe(vector.webhook_signature as string);
  });

  test("during a rotation the header carries both signatures, newest first, and either secret verifies", () => {
    const timestamp = Number(vector.webhook_timestamp);
    const headers = signatureHeaders(
      [vector.secret as string, vector.previous_secret as string],
      vector.webhook_id as string,
      timestamp,
      vector.body as string,
    );
    expect(headers).toEqual({
      "webhook-id": vector.webhook_id as string,
      "webhook-timestamp": vector.webhook_timestamp as string,
      "webhook-signature": vector.webhook_signature_during_rotation as string,
    });
    // The reference verifier checks the timestamp against now: verify at the vector's time.
    const at = Date.now;
    Date.now = () => timestamp * 1000;
    try {
      for (const secret of [vector.secret, vector.previous_secret] as string[]) {
        expect(new Webhook(secret).verify(vector.body as string, headers)).toMatchObject({
          type: "license.revoked",
        });
      }
      const other = `${SECRET_PREFIX}${Buffer.alloc(32, 0x43).toString("base64")}`;
      expect(() => new Webhook(other).verify(vector.body as string, headers)).toThrow();
      expect(() => new Webhook(vector.secret as string).verify(`${vector.body} `, headers)).toThrow();
    } finally {
      Date.now = at;
    }
  });
});
