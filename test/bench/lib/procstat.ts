import { readdirSync, readFileSync } from "node:fs";

/**
 * Process CPU and memory from /proc: utime+stime of every thread of the process (field 14 and 15
 * of /proc/<pid>/stat, in clock ticks), and VmRSS / VmHWM of /proc/<pid>/status.
 */
const CLOCK_TICKS_PER_SEC = 100;

export interface ProcSample {
  /** Wall clock, ms (performance.now()). */
  at: number;
  /** User + system CPU seconds consumed so far by the process (all threads). */
  cpuSec: number;
  rssMiB: number;
  hwmMiB: number;
}

export function cpuSeconds(pid: number, tid?: number): number {
  const { userSec, systemSec } = cpuSplit(pid, tid);
  return userSec + systemSec;
}

/** User and system (kernel) CPU seconds of a process or one of its threads. */
export function cpuSplit(pid: number, tid?: number): { userSec: number; systemSec: number } {
  const stat = readFileSync(
    tid === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${tid}/stat`,
    "utf8",
  );
  // The command name (field 2) is in parentheses and may contain spaces: split after it.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return {
    userSec: Number(fields[11]) / CLOCK_TICKS_PER_SEC,
    systemSec: Number(fields[12]) / CLOCK_TICKS_PER_SEC,
  };
}

export function memoryMiB(pid: number): { rssMiB: number; hwmMiB: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kib = (name: string) =>
    Number(new RegExp(`^${name}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? Number.NaN);
  return { rssMiB: kib("VmRSS") / 1024, hwmMiB: kib("VmHWM") / 1024 };
}

export function sample(pid: number): ProcSample {
  return { at: performance.now(), cpuSec: cpuSeconds(pid), ...memoryMiB(pid) };
}

/** CPU use between two samples, in % of one core (200% = both cores of this machine busy). */
export function cpuPercent(before: ProcSample, after: ProcSample): number {
  const wallSec = (after.at - before.at) / 1000;
  return wallSec > 0 ? ((after.cpuSec - before.cpuSec) / wallSec) * 100 : 0;
}

export interface MachineInfo {
  cpuModel: string;
  /** "family 25 model 17 stepping 1", for a model name as terse as "AMD EPYC" under a hypervisor. */
  cpuId: string;
  virtualised: boolean;
  cores: number;
  cpuMHz: number;
  memGiB: number;
  kernel: string;
}

export function machineInfo(): MachineInfo {
  const cpuinfo = readFileSync("/proc/cpuinfo", "utf8");
  const meminfo = readFileSync("/proc/meminfo", "utf8");
  const cores = cpuinfo.split("\n").filter((line) => line.startsWith("processor")).length;
  return {
    cpuModel: /^model name\s*:\s*(.*)$/m.exec(cpuinfo)?.[1]?.trim() ?? "unknown",
    cpuId: ["cpu family", "model", "stepping"]
      .map(
        (field) =>
          `${field.replace("cpu ", "")} ${new RegExp(`^${field}\\s*:\\s*(.*)$`, "m").exec(cpuinfo)?.[1]?.trim() ?? "?"}`,
      )
      .join(" "),
    virtualised: /^flags\s*:.*\bhypervisor\b/m.test(cpuinfo),
    cores,
    cpuMHz: Number(/^cpu MHz\s*:\s*(.*)$/m.exec(cpuinfo)?.[1] ?? Number.NaN),
    memGiB: Number(/^MemTotal:\s+(\d+) kB/m.exec(meminfo)?.[1] ?? 0) / 1024 / 1024,
    kernel: readFileSync("/proc/sys/kernel/osrelease", "utf8").trim(),
  };
}

/** Busy CPU seconds of the whole machine (all cores) from /proc/stat: everything but idle and iowait. */
export function machineBusySeconds(): number {
  const line = readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "";
  const [, user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).map(Number);
  return (
    ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (irq ?? 0) + (softirq ?? 0) + (steal ?? 0)) /
    CLOCK_TICKS_PER_SEC
  );
}

/** CPU seconds per thread of a process so far, keyed by thread id, with the thread's name. */
export function threadCpu(pid: number): Map<number, { name: string; cpuSec: number; systemSec: number }> {
  const threads = new Map<number, { name: string; cpuSec: number; systemSec: number }>();
  for (const tid of readdirSync(`/proc/${pid}/task`).map(Number)) {
    try {
      const name = readFileSync(`/proc/${pid}/task/${tid}/comm`, "utf8").trim();
      const { userSec, systemSec } = cpuSplit(pid, tid);
      threads.set(tid, { name, cpuSec: userSec + systemSec, systemSec });
    } catch {
      // The thread ended between the listing and the read.
    }
  }
  return threads;
}
