import { createHash } from "node:crypto";

/**
 * The buyer's claim page. The token travels in the link's fragment (`#…`), which browsers never
 * send, so it stays out of server and proxy logs; link scanners that fetch the page redeem
 * nothing, because only the button's POST does. Self-contained: no external assets.
 */
const SCRIPT = `
const token = decodeURIComponent(location.hash.slice(1));
const out = document.getElementById("out");
const button = document.getElementById("claim");
if (!token) { out.textContent = "This link has no claim token. Open the link from your email."; button.hidden = true; }
button.addEventListener("click", async () => {
  button.disabled = true;
  const response = await fetch(location.pathname.replace(/\\/$/, "") + "/redeem", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token }),
  });
  const body = await response.json();
  history.replaceState(null, "", location.pathname);
  if (!response.ok) { out.textContent = body.error.message; return; }
  const d = body.data;
  out.textContent = "";
  const p = document.createElement("p");
  p.textContent = "Your license key for " + d.product_name + " (shown once; keep it):";
  const key = document.createElement("pre");
  key.textContent = d.license_key;
  out.append(p, key);
  button.hidden = true;
});
`;

const html = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer"><title>Claim your license</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto; line-height: 1.5">
<h1>Claim your license</h1>
<p>The key is shown once. Claim it when you are ready to copy it.</p>
<button id="claim" type="button">Show my license key</button>
<div id="out" style="margin-top: 1em; font-size: 1.1em"></div>
<script>${SCRIPT}</script>
</body></html>
`;

const scriptHash = createHash("sha256").update(SCRIPT).digest("base64");

export const CLAIM_PAGE = {
  html,
  headers: {
    "content-type": "text/html; charset=utf-8",
    "content-security-policy": `default-src 'none'; script-src 'sha256-${scriptHash}'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`,
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
  },
};
