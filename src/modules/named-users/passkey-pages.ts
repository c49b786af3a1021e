import { createHash } from "node:crypto";

/**
 * The two pages a license user's browser opens: registering a passkey (from the vendor's link) and
 * approving a sign-in with it (from the verification email). Secrets travel in the fragment,
 * which browsers never send, so they stay out of logs; a link scanner that fetches a page does
 * nothing, because only the button's requests do. Self-contained: no external assets.
 */
const COMMON = `
const out = document.getElementById("out");
const button = document.getElementById("go");
const enc = (buf) => btoa(String.fromCharCode(...new Uint8Array(buf))).replace(/\\+/g, "-").replace(/\\//g, "_").replace(/=+$/, "");
const dec = (s) => Uint8Array.from(atob(s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4)), (c) => c.charCodeAt(0));
const post = async (path, body) => {
  const response = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { ok: response.ok, body: await response.json() };
};
const say = (text) => { out.textContent = text; };
// The page is also served at its path with one trailing slash: the routes are under the bare path.
const base = location.pathname.replace(/\\/$/, "");
// Browsers offer passkeys only to secure pages (https, or http on localhost): say so, not that the
// browser lacks them, on a page served over plain http from another host.
if (!window.isSecureContext) { say("Passkeys need a secure page (https://), and this one was opened over plain http. Ask for a link that starts with https://."); button.hidden = true; }
else if (!window.PublicKeyCredential) { say("This browser does not support passkeys."); button.hidden = true; }
// A link a mail program mangled (a stray %) must end in the message below, not in a script error
// that leaves a button doing nothing.
const fragment = (() => { try { return decodeURIComponent(location.hash.slice(1)); } catch { return ""; } })();
const incomplete = () => { say("This link is incomplete. Open the link you were sent, whole."); button.hidden = true; };
`;

const REGISTER_SCRIPT = `${COMMON}
const token = fragment;
if (!token) incomplete();
button.addEventListener("click", async () => {
  button.disabled = true;
  try {
    const options = await post(base + "/options", { token });
    if (!options.ok) return say(options.body.error.message);
    const o = options.body.data;
    const credential = await navigator.credentials.create({ publicKey: {
      challenge: dec(o.challenge),
      rp: { id: o.rp_id, name: "Licensing" },
      user: { id: new TextEncoder().encode(o.user_id), name: o.user_name, displayName: o.user_name },
      pubKeyCredParams: [{ type: "public-key", alg: -8 }, { type: "public-key", alg: -7 }],
      excludeCredentials: o.exclude_credentials.map((id) => ({ type: "public-key", id: dec(id) })),
      authenticatorSelection: { residentKey: "preferred", userVerification: "preferred" },
      attestation: "none",
    } });
    const done = await post(base, {
      token,
      credential_id: credential.id,
      client_data_json: enc(credential.response.clientDataJSON),
      attestation_object: enc(credential.response.attestationObject),
    });
    history.replaceState(null, "", location.pathname);
    if (!done.ok) return say(done.body.error.message);
    say("Your passkey is registered. You can close this page.");
    button.hidden = true;
  } catch (error) {
    say("The passkey was not created: " + error.message);
    button.disabled = false;
  }
});
`;

const APPROVE_SCRIPT = `${COMMON}
const dot = fragment.indexOf(".");
const verification_id = fragment.slice(0, dot);
const secret = fragment.slice(dot + 1);
if (dot < 1) incomplete();
button.addEventListener("click", async () => {
  button.disabled = true;
  try {
    const options = await post(base + "/options", { verification_id, secret });
    if (!options.ok) return say(options.body.error.message);
    const o = options.body.data;
    const credential = await navigator.credentials.get({ publicKey: {
      challenge: dec(o.challenge),
      rpId: o.rp_id,
      allowCredentials: o.allow_credentials.map((id) => ({ type: "public-key", id: dec(id) })),
      userVerification: "preferred",
    } });
    const done = await post(base, {
      verification_id,
      secret,
      credential_id: credential.id,
      client_data_json: enc(credential.response.clientDataJSON),
      authenticator_data: enc(credential.response.authenticatorData),
      signature: enc(credential.response.signature),
    });
    if (!done.ok) { button.disabled = false; return say(done.body.error.message); }
    history.replaceState(null, "", location.pathname);
    say("Enter this code in the app as your second factor: " + done.body.data.approval_code);
    button.hidden = true;
  } catch (error) {
    say("The passkey was not used: " + error.message);
    button.disabled = false;
  }
});
`;

const page = (title: string, intro: string, action: string, script: string) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer"><title>${title}</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto; line-height: 1.5">
<h1>${title}</h1>
<p>${intro}</p>
<button id="go" type="button">${action}</button>
<div id="out" style="margin-top: 1em; font-size: 1.2em"></div>
<script>${script}</script>
</body></html>
`;

const headers = (script: string) => ({
  "content-type": "text/html; charset=utf-8",
  "content-security-policy": `default-src 'none'; script-src 'sha256-${createHash("sha256").update(script).digest("base64")}'; style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'`,
  "cache-control": "no-store",
  "referrer-policy": "no-referrer",
  "x-content-type-options": "nosniff",
});

export const REGISTER_PAGE = {
  html: page(
    "Register a passkey",
    "A passkey lets you approve sign-ins to the app as your second factor.",
    "Create a passkey",
    REGISTER_SCRIPT,
  ),
  headers: headers(REGISTER_SCRIPT),
};

export const APPROVE_PAGE = {
  html: page(
    "Approve the sign-in",
    "Use your passkey to approve the sign-in you started in the app. You will get a code to enter there.",
    "Approve with my passkey",
    APPROVE_SCRIPT,
  ),
  headers: headers(APPROVE_SCRIPT),
};
