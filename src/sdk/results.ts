/** What LicensingClient's calls take and answer, beyond the options (options.ts). */
import type { CertificateClaims } from "./certificate.ts";
import type { MachineInfo } from "./state.ts";

export interface ActivateOptions {
  licenseKey: string;
  machineInfo: MachineInfo;
  machineSignals?: Record<string, string>;
  namedUserToken?: string;
}

export interface ActivationResult {
  activationId: string;
  licenseId: string;
  machineInfoDigest: string;
  certificate: CertificateClaims;
  serverTime: number;
}

export interface HeartbeatResult {
  activationId: string;
  licenseStatus: string;
  nextHeartbeatIn: number;
  machineInfoDigest: string;
  certificate: CertificateClaims;
  serverTime: number;
}

export interface Lease {
  leaseId: string;
  instanceId: string;
  expiresAt: number;
  heartbeatIn: number;
  serverTime: number;
}

export interface ServerTime {
  /** Unix seconds. */
  serverTime: number;
  iso: string;
}
