/** Time comes from here, never from Date.now() in logic, so tests and the test clock can move it. */
export interface Clock {
  now(): Date;
}

export const systemClock: Clock = { now: () => new Date() };

/** A clock that starts at real time and can be pushed forward (the --test-clock route, tests). */
export class AdjustableClock implements Clock {
  private offsetMs = 0;
  private frozenAtMs: number | null = null;
  constructor(private readonly base: Clock = systemClock) {}
  now(): Date {
    return new Date((this.frozenAtMs ?? this.base.now().getTime()) + this.offsetMs);
  }
  /** Holds time still (advance still moves it), so a test at an exact boundary cannot straddle a second. */
  freeze(): Date {
    this.frozenAtMs = this.base.now().getTime();
    return this.now();
  }
  /** Lets time run again from where it stands, for tests that share one clock across a file. */
  resume(): Date {
    if (this.frozenAtMs !== null) {
      this.offsetMs += this.frozenAtMs - this.base.now().getTime();
      this.frozenAtMs = null;
    }
    return this.now();
  }
  advance(seconds: number): Date {
    this.offsetMs += seconds * 1000;
    return this.now();
  }
}

export const unixSeconds = (date: Date): number => Math.floor(date.getTime() / 1000);
export const isoString = (date: Date): string => date.toISOString();

/** Unix seconds as ISO 8601 with whole seconds (`2027-01-15T08:00:05Z`): signed time, key dates. */
export const isoSeconds = (unix: number): string => new Date(unix * 1000).toISOString().replace(".000Z", "Z");
