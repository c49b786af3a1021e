import { LicensingClient, type LicensingClientOptions, MemoryStorage } from "../../../src/sdk/index.ts";
import { T0 } from "./authority.ts";
import { FakeServer } from "./fake-server.ts";
import { FakeTimer } from "./fake-timer.ts";

export const MACHINE = { os: "linux", arch: "x64", hostname: "build-7" };

export interface Harness {
  server: FakeServer;
  storage: MemoryStorage;
  clock: { ms: number };
  timer: FakeTimer;
  client: LicensingClient;
  /** A second client on the same storage (as after an app restart). */
  restart(extra?: Partial<LicensingClientOptions>): LicensingClient;
}

export function harness(extra: Partial<LicensingClientOptions> = {}, server = new FakeServer()): Harness {
  const storage = new MemoryStorage();
  const clock = { ms: T0 * 1000 };
  const timer = new FakeTimer();
  const make = (more: Partial<LicensingClientOptions> = {}) =>
    new LicensingClient({
      config: server.authority.config(),
      fetch: (url, init) => server.fetch(url, init),
      storage,
      now: () => clock.ms,
      timer,
      appVersion: "2.0.0",
      ...extra,
      ...more,
    });
  return { server, storage, clock, timer, client: make(), restart: make };
}

export async function activated(extra: Partial<LicensingClientOptions> = {}): Promise<Harness> {
  const h = harness(extra);
  await h.client.activate({ licenseKey: "LK-1234", machineInfo: MACHINE });
  return h;
}
