import { join } from "node:path";
import type { BunPlugin } from "bun";

/**
 * `npm run build:sdk`: the client SDK (src/sdk) as one ES module for browsers,
 * build/out/licensing-sdk.js. Any bundler works; this one keeps Node's crypto out.
 *
 * @hpke/common falls back to `import("crypto")` for Node 18, which has no global Web Crypto. A
 * browser bundler cannot tell that branch is dead, so it bundles its Node crypto stand-in (about
 * 0.6 MB of crypto-browserify, elliptic, bn.js and stream shims). Here that import resolves to the
 * platform's own Web Crypto, which is what the fallback would have returned.
 */
const platformWebCrypto: BunPlugin = {
  name: "platform-web-crypto",
  setup(build) {
    build.onResolve({ filter: /^(node:)?crypto$/ }, (args) => ({ path: args.path, namespace: "web-crypto" }));
    build.onLoad({ filter: /.*/, namespace: "web-crypto" }, () => ({
      contents: "export const webcrypto = globalThis.crypto;\nexport default { webcrypto };\n",
      loader: "js",
    }));
  },
};

const ENTRY = join(import.meta.dir, "../src/sdk/index.ts");

/** The SDK bundled for browsers, in memory; `stubNodeCrypto: false` shows what a plain bundle holds. */
export async function bundleBrowserSdk(options: { minify?: boolean; stubNodeCrypto?: boolean } = {}) {
  const result = await Bun.build({
    entrypoints: [ENTRY],
    target: "browser",
    format: "esm",
    minify: options.minify ?? false,
    plugins: options.stubNodeCrypto === false ? [] : [platformWebCrypto],
  });
  const output = result.outputs[0];
  if (!result.success || !output) throw new Error(`the SDK did not bundle: ${result.logs.join("\n")}`);
  return output;
}

if (import.meta.main) {
  const output = await bundleBrowserSdk({ minify: true });
  const target = join(import.meta.dir, "out/licensing-sdk.js");
  await Bun.write(target, output);
  console.log(`wrote ${target} (${(output.size / 1024).toFixed(0)} KiB)`);
}
