import type { Fixture } from "./fixture.ts";
import {
  activationRequest,
  type BenchDevice,
  type BenchRequest,
  heartbeatRequest,
  leaseAcquireRequest,
  leaseHeartbeatRequest,
  pickFrom,
} from "./requests.ts";
import type { BenchServer } from "./server.ts";

export interface CrashResult {
  loadSec: number;
  sent: number;
  /** 2xx answers received before the kill, by kind. */
  acknowledged: { heartbeats: number; activations: number; leases: number };
  /** Requests that had been sent and were unanswered when the process died (outcome unknown to the client). */
  inFlightAtKill: number;
  restartMs: number;
  /** Acknowledged activations / leases that a signed call after the restart could not find. */
  lostActivations: string[];
  lostLeases: string[];
  checked: { activations: number; leases: number };
}

type Op = "heartbeat" | "activation" | "lease";

async function send(url: string, request: BenchRequest): Promise<{ status: number; body: string }> {
  const response = await fetch(`${url}${request.path}`, {
    method: request.method,
    headers: request.headers,
    body: request.body === "" ? undefined : request.body,
  });
  return { status: response.status, body: await response.text() };
}

/**
 * kill -9 during a heartbeat + activation + lease load, then restart and prove that every activation
 * and lease the server acknowledged (2xx) before it died is still there: each acknowledged activation
 * must answer a signed heartbeat from its device with 200, and each acknowledged lease a signed lease
 * heartbeat with 200. A custom client, not wrk, because the acknowledged ids come from the responses.
 */
export async function crashTest(options: {
  server: BenchServer;
  restart: () => Promise<BenchServer>;
  fixture: Fixture;
  devices: BenchDevice[];
  parallel: number;
  killAfterMs: number;
  log: (line: string) => void;
}): Promise<{ result: CrashResult; server: BenchServer }> {
  const { server, fixture, devices } = options;
  const ackedActivations: BenchDevice[] = [];
  const ackedLeases: { device: BenchDevice; leaseId: string; instanceId: string }[] = [];
  let heartbeats = 0;
  let sent = 0;
  let inFlight = 0;
  let killed = false;
  let inFlightAtKill = 0;
  let instance = 0;
  const pick = () => pickFrom(devices);

  const worker = async () => {
    while (!killed) {
      const roll = Math.random();
      const op: Op = roll < 0.5 ? "heartbeat" : roll < 0.8 ? "activation" : "lease";
      let request: BenchRequest;
      let newDevice: BenchDevice | undefined;
      let lease: { device: BenchDevice; instanceId: string } | undefined;
      if (op === "heartbeat") request = heartbeatRequest(pick());
      else if (op === "activation") {
        const made = activationRequest(fixture.licenseKey, fixture.productId);
        request = made.request;
        newDevice = { signer: made.device, activationId: "" };
      } else {
        const device = pick();
        const instanceId = `crash-${++instance}`;
        lease = { device, instanceId };
        request = leaseAcquireRequest(device, instanceId);
      }
      sent++;
      inFlight++;
      try {
        const response = await send(server.url, request);
        inFlight--;
        if (response.status < 200 || response.status > 299) continue;
        const data = (JSON.parse(response.body) as { data: Record<string, string> }).data;
        if (op === "heartbeat") heartbeats++;
        else if (newDevice)
          ackedActivations.push({ ...newDevice, activationId: data.activation_id as string });
        else if (lease) ackedLeases.push({ ...lease, leaseId: data.lease_id as string });
      } catch {
        inFlight--;
        if (!killed) await Bun.sleep(1);
      }
    }
  };

  const started = performance.now();
  const workers = Array.from({ length: options.parallel }, worker);
  await Bun.sleep(options.killAfterMs);
  inFlightAtKill = inFlight;
  server.proc.kill("SIGKILL");
  killed = true;
  await server.proc.exited;
  const loadSec = (performance.now() - started) / 1000;
  await Promise.all(workers);
  options.log(
    `  killed after ${loadSec.toFixed(1)} s: ${ackedActivations.length} activations, ${ackedLeases.length} leases and ${heartbeats} heartbeats acknowledged, ${inFlightAtKill} requests in flight`,
  );

  const restarted = await options.restart();
  const lostActivations: string[] = [];
  const lostLeases: string[] = [];
  const checks: (() => Promise<void>)[] = [
    ...ackedActivations.map((device) => async () => {
      const response = await send(restarted.url, heartbeatRequest(device));
      if (response.status !== 200) lostActivations.push(`${device.activationId} (${response.status})`);
    }),
    ...ackedLeases.map((lease) => async () => {
      const response = await send(
        restarted.url,
        leaseHeartbeatRequest(lease.device, lease.leaseId, lease.instanceId),
      );
      if (response.status !== 200) lostLeases.push(`${lease.leaseId} (${response.status})`);
    }),
  ];
  let next = 0;
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      while (next < checks.length) await (checks[next++] as () => Promise<void>)();
    }),
  );
  return {
    server: restarted,
    result: {
      loadSec,
      sent,
      acknowledged: { heartbeats, activations: ackedActivations.length, leases: ackedLeases.length },
      inFlightAtKill,
      restartMs: restarted.startupMs,
      lostActivations,
      lostLeases,
      checked: { activations: ackedActivations.length, leases: ackedLeases.length },
    },
  };
}
