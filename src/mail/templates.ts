/**
 * Mail templates: a subject, a plain-text body and an HTML body per template and locale. English
 * is shipped; another locale is one more entry in LOCALES, and any template it lacks falls back to
 * English, as does a locale nobody has written.
 */

export type MailTemplateName = "email_verification_code" | "trial_verification_code" | "license_delivery";

export const MAIL_TEMPLATE_NAMES: readonly MailTemplateName[] = [
  "email_verification_code",
  "trial_verification_code",
  "license_delivery",
];

export interface RenderedMail {
  subject: string;
  text: string;
  html: string;
}

/** Template data is strings only; every value is HTML-escaped before it reaches the HTML body. */
type TemplateData = Record<string, string>;
type Template = (data: TemplateData, html: (value: string) => string) => RenderedMail;

export const DEFAULT_LOCALE = "en";

const field = (data: TemplateData, name: string): string => data[name] ?? "";

const layout = (title: string, paragraphs: string[]): string =>
  `<!doctype html><html><head><meta charset="utf-8"><title>${title}</title></head>` +
  `<body style="font-family: sans-serif; line-height: 1.5">${paragraphs.map((p) => `<p>${p}</p>`).join("")}</body></html>`;

const en: Record<MailTemplateName, Template> = {
  email_verification_code: (data, h) => {
    const product = field(data, "product_name");
    const code = field(data, "code");
    const minutes = field(data, "expires_minutes") || "10";
    const approval = data.approval_url;
    const text = [
      `Your verification code for ${product} is: ${code}`,
      "",
      `Enter it in the app within ${minutes} minutes. The code works once.`,
      ...(approval
        ? [
            "",
            "To use your passkey as the second factor, open this link; it shows a code to enter in the app:",
            approval,
          ]
        : []),
      "",
      "If you did not ask for this code, you can ignore this message.",
    ].join("\n");
    const html = layout(`Verification code for ${h(product)}`, [
      `Your verification code for <strong>${h(product)}</strong> is:`,
      `<span style="font-size: 1.6em; letter-spacing: 0.2em; font-family: monospace">${h(code)}</span>`,
      `Enter it in the app within ${h(minutes)} minutes. The code works once.`,
      ...(approval
        ? [
            `To use your passkey as the second factor, <a href="${h(approval)}">approve this sign-in</a>; it shows a code to enter in the app.`,
          ]
        : []),
      "If you did not ask for this code, you can ignore this message.",
    ]);
    return { subject: `${code} is your ${product} verification code`, text, html };
  },
  trial_verification_code: (data, h) => {
    const product = field(data, "product_name");
    const code = field(data, "code");
    const minutes = field(data, "expires_minutes") || "10";
    const text = [
      `Your code to start a trial of ${product} is: ${code}`,
      "",
      `Enter it in the app within ${minutes} minutes. The code works once.`,
      "",
      "If you did not ask for a trial, you can ignore this message.",
    ].join("\n");
    const html = layout(`Trial code for ${h(product)}`, [
      `Your code to start a trial of <strong>${h(product)}</strong> is:`,
      `<span style="font-size: 1.6em; letter-spacing: 0.2em; font-family: monospace">${h(code)}</span>`,
      `Enter it in the app within ${h(minutes)} minutes. The code works once.`,
      "If you did not ask for a trial, you can ignore this message.",
    ]);
    return { subject: `${code} is your ${product} trial code`, text, html };
  },
  // Billing: either a single-use claim link (secure claims) or the key itself.
  license_delivery: (data, h) => {
    const product = field(data, "product_name");
    const claimUrl = data.claim_url;
    const key = field(data, "license_key");
    const expires = data.expires_at ? `It is valid until ${data.expires_at}.` : "It does not expire.";
    const text = [
      `Thank you for buying ${product}.`,
      "",
      ...(claimUrl
        ? ["Open this link to see your license key. It shows the key once and works for 30 days:", claimUrl]
        : ["Your license key is:", key]),
      "",
      expires,
    ].join("\n");
    const html = layout(`Your ${h(product)} license`, [
      `Thank you for buying <strong>${h(product)}</strong>.`,
      claimUrl
        ? `<a href="${h(claimUrl)}">Show my license key</a> (shown once; the link works for 30 days).`
        : `Your license key is: <span style="font-family: monospace">${h(key)}</span>`,
      h(expires),
    ]);
    return { subject: `Your ${product} license`, text, html };
  },
};

/** Locale tag (lowercase language, or language-region) to its templates. */
const LOCALES: Record<string, Partial<Record<MailTemplateName, Template>>> = { en };

const escapeHtml = (value: string): string => value.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/** `de-AT` tries `de-at`, then `de`, then English. */
export function resolveLocale(locale: string | undefined, template: MailTemplateName): string {
  const tag = (locale ?? "").trim().toLowerCase().replace(/_/g, "-");
  for (const candidate of [tag, tag.split("-")[0] ?? ""]) {
    if (candidate && LOCALES[candidate]?.[template]) return candidate;
  }
  return DEFAULT_LOCALE;
}

export function renderMail(
  template: MailTemplateName,
  locale: string | undefined,
  data: TemplateData,
): RenderedMail {
  const resolved = resolveLocale(locale, template);
  const render = LOCALES[resolved]?.[template] ?? en[template];
  // Header injection: a subject never carries a line break, whatever the data holds.
  const mail = render(data, escapeHtml);
  return { ...mail, subject: mail.subject.replace(/[\r\n]+/g, " ") };
}

export const isMailTemplateName = (value: string): value is MailTemplateName =>
  (MAIL_TEMPLATE_NAMES as readonly string[]).includes(value);
