import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import type { Deps } from "../../src/deps.ts";
import { silentLogger } from "../../src/http/logger.ts";
import { WebhookDispatcher } from "../../src/jobs/webhook-dispatcher.ts";
import { announceExpiries } from "../../src/modules/webhooks/expiries.ts";
import { WebhookService } from "../../src/modules/webhooks/service.ts";
import { openStore } from "../../src/store/db.ts";
import { createTestContext, type TestContext } from "../support/harness.ts";
import { queryPlan, sqlPreparedDuring } from "../support/query-plan.ts";
import { activatedDevice, proofCall, runtimeFixture } from "../support/runtime.ts";

/**
 * lease.expired from a scan that reads the leases table in chunks (expiries.ts): every lease that
 * expired in the window is announced once, however many calls the scan takes, across a restart,
 * and with leases taken while it runs.
 */
let t: TestContext;
beforeEach(() => {
  t = createTestContext();
  // Held still: the windows below are set against lease expiries to the millisecond.
  t.clock.freeze();
});
afterEach(() => t.close());

const TTL = 600;

function subscribe(url = "https://receiver.example.com/hook") {
  new WebhookService(t.deps, { allowPrivateNetworks: true }).create(
    { url, events: ["lease.expired"] },
    { actor: { type: "cli", id: "test" }, environment: "live", requestId: null },
  );
}

const announcedLeases = () =>
  t.deps.sqlite
    .query<{ payload: string }, []>(
      "SELECT e.payload FROM webhook_deliveries d JOIN webhook_events e ON e.id = d.event_id WHERE e.type = 'lease.expired' ORDER BY d.id",
    )
    .all()
    .map((row) => (JSON.parse(row.payload) as { data: { target: { id: string } } }).data.target.id);

const leaseMark = () =>
  t.deps.sqlite
    .query<{ value: number }, []>("SELECT value FROM webhook_marks WHERE name = 'lease.expired'")
    .get()?.value;

const scanMarks = () =>
  t.deps.sqlite
    .query<{ name: string }, []>(
      "SELECT name FROM webhook_marks WHERE name LIKE 'lease.expired:%' ORDER BY name",
    )
    .all()
    .map((row) => row.name);

/** A device on a floating license: takes leases (returning their ids), renews them, deactivates. */
async function leaseTaker() {
  const fx = await runtimeFixture(t, {
    policy: { max_machines: 10, max_concurrent: 100, concurrency_unit: "instance", lease_ttl_sec: TTL },
  });
  const d = await activatedDevice(t, fx);
  const instances = new Map<string, string>();
  const take = async (instance: string): Promise<string> => {
    const response = await proofCall(t, d.device, "POST", "/runtime/v1/leases", d.activationId, {
      activation_id: d.activationId,
      instance_id: instance,
    });
    expect(response.status).toBe(201);
    instances.set(response.body.data.lease_id, instance);
    return response.body.data.lease_id as string;
  };
  const renew = async (leaseId: string) => {
    const path = `/runtime/v1/leases/${leaseId}/heartbeat`;
    const response = await proofCall(t, d.device, "POST", path, d.activationId, {
      instance_id: instances.get(leaseId),
    });
    expect(response.status).toBe(200);
  };
  const deactivate = async () => {
    const path = `/runtime/v1/activations/${d.activationId}`;
    expect((await proofCall(t, d.device, "DELETE", path, d.activationId)).status).toBe(200);
  };
  return { take, renew, deactivate };
}

/** Calls until the scan has no chunks left; returns how many calls it took and what they queued. */
function scanToTheEnd(deps: Pick<Deps, "sqlite" | "clock" | "ids"> = t.deps, leaseScanChunk = 2) {
  let calls = 0;
  let queued = 0;
  for (;;) {
    calls++;
    const result = announceExpiries(deps, { leaseScanChunk });
    queued += result.queued;
    if (!result.more) return { calls, queued };
    if (calls > 100) throw new Error("the scan never ends");
  }
}

describe("the lease scan in chunks", () => {
  test("every lease that expired is announced once, across as many calls as the table has chunks", async () => {
    const { take } = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    const leases: string[] = [];
    for (let i = 0; i < 7; i++) leases.push(await take(`instance-${i}`));
    t.clock.advance(TTL + 1);
    const { calls, queued } = scanToTheEnd();
    // Seven rows in chunks of two: four calls, the first three with more to come.
    expect(calls).toBe(4);
    expect(queued).toBe(7);
    expect(announcedLeases().sort()).toEqual([...leases].sort());
    expect(scanMarks()).toEqual([]);
    // The window is closed: scanning again announces nothing.
    expect(scanToTheEnd().queued).toBe(0);
    expect(announcedLeases()).toHaveLength(7);
  });

  test("the mark moves only when the last chunk is read, so a scan part-way announces nothing twice", async () => {
    const { take } = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    for (let i = 0; i < 5; i++) await take(`instance-${i}`);
    t.clock.advance(TTL + 1);
    const markBefore = leaseMark();
    const first = announceExpiries(t.deps, { leaseScanChunk: 2 });
    expect(first).toEqual({ queued: 2, more: true });
    expect(leaseMark()).toBe(markBefore);
    expect(scanMarks()).toEqual([
      "lease.expired:scan-after-rowid",
      "lease.expired:scan-last-rowid",
      "lease.expired:scan-until",
    ]);
    // Time passes between chunks; the scan keeps its own window.
    t.clock.advance(30);
    expect(scanToTheEnd().queued).toBe(3);
    // The window closes where the scan began, not where it ended.
    expect(leaseMark()).toBe(t.clock.now().getTime() - 30_000);
    expect(new Set(announcedLeases()).size).toBe(5);
    expect(announcedLeases()).toHaveLength(5);
  });

  test("a restart part-way continues from the stored position: a new connection finishes the scan", async () => {
    const { take } = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    const leases: string[] = [];
    for (let i = 0; i < 5; i++) leases.push(await take(`instance-${i}`));
    t.clock.advance(TTL + 1);
    expect(announceExpiries(t.deps, { leaseScanChunk: 2 }).more).toBe(true);
    const store = openStore(`${t.dir}/licensing.db`);
    try {
      const restarted = { ...t.deps, db: store.db, sqlite: store.sqlite };
      expect(scanToTheEnd(restarted).queued).toBe(3);
    } finally {
      store.close();
    }
    expect(announcedLeases().sort()).toEqual([...leases].sort());
  });

  test("a lease taken while a scan runs is announced by the next one, when it expires", async () => {
    const { take } = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    const early = [await take("early-1"), await take("early-2"), await take("early-3")];
    t.clock.advance(TTL + 1);
    expect(announceExpiries(t.deps, { leaseScanChunk: 2 }).more).toBe(true);
    const late = await take("late");
    expect(scanToTheEnd().queued).toBe(1);
    expect(announcedLeases().sort()).toEqual([...early].sort());
    t.clock.advance(TTL + 1);
    expect(scanToTheEnd().queued).toBe(1);
    expect(announcedLeases().at(-1)).toBe(late);
  });

  test("a lease renewed in time is never announced, whichever chunk it is in", async () => {
    const { take, renew } = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    const lapsing = [await take("a"), await take("b")];
    const kept = [await take("c"), await take("d")];
    t.clock.advance(TTL - 60);
    for (const lease of kept) await renew(lease);
    t.clock.advance(120);
    expect(scanToTheEnd().queued).toBe(2);
    expect(announcedLeases().sort()).toEqual([...lapsing].sort());
  });

  test("a lapsed lease its device's deactivation released before its chunk was read is still announced", async () => {
    const first = await leaseTaker();
    const second = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    const leases = [await first.take("a"), await first.take("b"), await second.take("c")];
    t.clock.advance(TTL + 1);
    expect(announceExpiries(t.deps, { leaseScanChunk: 2 })).toEqual({ queued: 2, more: true });
    // Deactivating releases every lease of the device, the lapsed one too.
    await second.deactivate();
    expect(scanToTheEnd().queued).toBe(1);
    expect(announcedLeases().sort()).toEqual([...leases].sort());
  });

  test("a chunk reads its range of rowids, not the whole table", async () => {
    const { take } = await leaseTaker();
    subscribe();
    announceExpiries(t.deps);
    await take("one");
    t.clock.advance(TTL + 1);
    const { sql } = await sqlPreparedDuring(t.deps.sqlite, () => announceExpiries(t.deps));
    const chunk = sql.find((text) => /FROM leases l/.test(text));
    expect(chunk).toBeDefined();
    expect(queryPlan(t.deps.sqlite, chunk as string)).toMatch(
      /^SEARCH l USING INTEGER PRIMARY KEY \(rowid>\? AND rowid<\?\)/,
    );
  });

  test("without a subscriber no scan starts and the mark moves on, so nothing from before is announced later", async () => {
    const { take } = await leaseTaker();
    announceExpiries(t.deps);
    await take("unheard");
    t.clock.advance(TTL + 1);
    expect(announceExpiries(t.deps, { leaseScanChunk: 2 })).toEqual({ queued: 0, more: false });
    expect(scanMarks()).toEqual([]);
    subscribe();
    expect(scanToTheEnd().queued).toBe(0);
  });
});

/** A receiver on 127.0.0.1 that keeps the lease id of every event it is sent. */
function leaseReceiver() {
  const received: string[] = [];
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    fetch: async (request) => {
      received.push(
        (JSON.parse(await request.text()) as { data: { target: { id: string } } }).data.target.id,
      );
      return new Response(null, { status: 204 });
    },
  });
  const until = async (count: number) => {
    for (let waited = 0; received.length < count && waited < 5_000; waited += 10) await Bun.sleep(10);
  };
  return { received, url: `http://127.0.0.1:${server.port}/hook`, until, stop: () => server.stop(true) };
}

describe("the running dispatcher", () => {
  test("runs a scan of many chunks to its end on its own, one chunk a turn, and delivers every expiry", async () => {
    const { received, url, until, stop: stopReceiver } = leaseReceiver();
    const { take } = await leaseTaker();
    subscribe(url);
    announceExpiries(t.deps);
    const leases: string[] = [];
    for (let i = 0; i < 7; i++) leases.push(await take(`instance-${i}`));
    t.clock.advance(TTL + 1);
    // Its next periodic scan is a minute away: only the scan at start can find the expiries, and
    // with two rows a chunk it has to go on by itself for four calls.
    const stop = new WebhookDispatcher(t.deps, {
      logger: silentLogger,
      allowPrivateNetworks: true,
      clock: t.clock,
      expiryScanMs: 60_000,
      pollMs: 20,
      leaseScanChunk: 2,
    }).start();
    // One chunk a turn: when start() returns, the scan is under way, not done.
    expect(scanMarks()).toHaveLength(3);
    try {
      await until(7);
    } finally {
      await stop();
      stopReceiver();
    }
    expect(received.sort()).toEqual([...leases].sort());
    expect(scanMarks()).toEqual([]);
  });

  test("a chunk that fails is logged and rolled back, and the next scan starts over and announces each lease once", async () => {
    const { received, url, until, stop: stopReceiver } = leaseReceiver();
    const { take } = await leaseTaker();
    subscribe(url);
    announceExpiries(t.deps);
    const leases: string[] = [];
    for (let i = 0; i < 5; i++) leases.push(await take(`instance-${i}`));
    t.clock.advance(TTL + 1);
    // The first chunk's write of the scan's position fails, as a full disk would fail it.
    t.deps.sqlite.run(
      `CREATE TEMP TRIGGER fail_scan BEFORE INSERT ON webhook_marks
       WHEN NEW.name = 'lease.expired:scan-after-rowid' AND NEW.value > 0
       BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END`,
    );
    const logged: string[] = [];
    const stop = new WebhookDispatcher(t.deps, {
      logger: { log: (_level, message) => logged.push(message) },
      allowPrivateNetworks: true,
      clock: t.clock,
      expiryScanMs: 50,
      pollMs: 20,
      leaseScanChunk: 2,
    }).start();
    try {
      expect(logged).toContain("webhook expiry scan failed");
      expect(scanMarks()).toEqual([]);
      expect(announcedLeases()).toEqual([]);
      t.deps.sqlite.run("DROP TRIGGER fail_scan");
      await until(5);
      await Bun.sleep(120);
    } finally {
      await stop();
      stopReceiver();
    }
    expect(received.sort()).toEqual([...leases].sort());
    expect(announcedLeases()).toHaveLength(5);
  });
});
