import { createHash, generateKeyPairSync } from "node:crypto";

/**
 * Generates real device keys for seed.ts: an Ed25519 signing key (its 32-byte seed is kept so the
 * bench can sign as that device later) and a P-256 KEM key, both as the contract's key strings.
 */
declare const self: Worker;

export interface KeyBatch {
  seeds: Uint8Array;
  signing: string[];
  thumbprints: string[];
  kem: string[];
}

self.onmessage = (event: MessageEvent<{ count: number }>) => {
  const { count } = event.data;
  const seeds = new Uint8Array(32 * count);
  const signing: string[] = [];
  const thumbprints: string[] = [];
  const kem: string[] = [];
  for (let i = 0; i < count; i++) {
    const pair = generateKeyPairSync("ed25519", {
      publicKeyEncoding: { type: "spki", format: "der" },
      privateKeyEncoding: { type: "pkcs8", format: "der" },
    });
    seeds.set(pair.privateKey.subarray(-32), i * 32);
    const text = `ed25519:${pair.publicKey.subarray(-32).toString("base64url")}`;
    signing.push(text);
    thumbprints.push(createHash("sha256").update(text).digest("hex"));
    const kemPair = generateKeyPairSync("ec", {
      namedCurve: "P-256",
      publicKeyEncoding: { type: "spki", format: "der" },
      privateKeyEncoding: { type: "pkcs8", format: "der" },
    });
    kem.push(`p256:${kemPair.publicKey.subarray(-65).toString("base64url")}`);
  }
  const batch: KeyBatch = { seeds, signing, thumbprints, kem };
  self.postMessage(batch);
};
