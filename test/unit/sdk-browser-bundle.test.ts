import { describe, expect, test } from "bun:test";
import { bundleBrowserSdk } from "../../build/sdk-browser.ts";

// Modules of the Node crypto stand-in a browser bundler substitutes for `import("crypto")`.
const NODE_CRYPTO_SHIMS = /crypto-browserify|browserify-sign|create-ecdh|elliptic\/lib|bn\.js/;

describe("the browser SDK bundle (npm run build:sdk)", () => {
  test("a plain browser bundle of the SDK carries Node's crypto stand-in, which the check detects", async () => {
    const plain = await (await bundleBrowserSdk({ stubNodeCrypto: false })).text();
    expect(plain).toMatch(NODE_CRYPTO_SHIMS);
  });

  test("the shipped bundle carries none of it and is less than half the plain one's size", async () => {
    const plain = await bundleBrowserSdk({ stubNodeCrypto: false, minify: true });
    const shipped = await bundleBrowserSdk({ minify: true });
    const text = await shipped.text();
    expect(text).not.toMatch(NODE_CRYPTO_SHIMS);
    expect(shipped.size).toBeLessThan(plain.size / 2);
    // HPKE's Node 18 fallback now reads the platform's Web Crypto.
    expect(text).toContain("globalThis.crypto");
  });
});
