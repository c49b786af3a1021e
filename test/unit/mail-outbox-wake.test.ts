import { expect, test } from "bun:test";
import { randomBytes } from "node:crypto";
import { SecretBox } from "../../src/crypto/secret-box.ts";
import { AdjustableClock } from "../../src/domain/clock.ts";
import { IdGenerator } from "../../src/domain/ids.ts";
import { MailOutbox } from "../../src/mail/outbox.ts";

/**
 * The worker must not run inside the request that queued the mail: if it did, a verification
 * start that sends a code would answer slower than one that does not, and the 202 would tell an
 * attacker whether the address matched (spec §4.2 rule 6).
 */
function outbox() {
  const rows: unknown[] = [];
  const writer = { insert: () => ({ values: (row: unknown) => ({ run: () => rows.push(row) }) }) };
  const mail = new MailOutbox({
    clock: new AdjustableClock(),
    ids: new IdGenerator(),
    secrets: new SecretBox(randomBytes(32)),
  });
  return { mail, rows, writer: writer as unknown as Parameters<MailOutbox["enqueue"]>[0] };
}

test("queued mail wakes the worker only after the request's own awaits have all run", async () => {
  const { mail, writer, rows } = outbox();
  let woken = 0;
  mail.onEnqueue(() => woken++);
  mail.enqueue(writer, {
    to: "a@example.test",
    template: "email_verification_code",
    data: { code: "123456" },
  });
  expect(rows).toHaveLength(1);
  // A request handler finishing: several microtask turns and a macrotask.
  for (let i = 0; i < 20; i++) await Promise.resolve();
  await new Promise((resolve) => setImmediate(resolve));
  expect(woken).toBe(0);
  const deadline = Date.now() + 2_000;
  while (woken === 0 && Date.now() < deadline) await Bun.sleep(10);
  expect(woken).toBe(1);
});

test("suppressed mail does the same writing work and never wakes the worker", async () => {
  const { mail, writer, rows } = outbox();
  let woken = 0;
  mail.onEnqueue(() => woken++);
  mail.enqueue(
    writer,
    { to: "a@example.test", template: "email_verification_code", data: { code: "123456" } },
    { suppressed: true },
  );
  expect(rows).toHaveLength(1);
  await Bun.sleep(700);
  expect(woken).toBe(0);
});
