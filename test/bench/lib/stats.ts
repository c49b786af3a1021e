/**
 * Two-sample statistics for the timing bench (verification-timing.ts): quantiles, a bootstrap
 * confidence interval of the difference of medians, and the two-sample Kolmogorov–Smirnov test.
 */

/** The q-quantile (0..1) of an ascending sample, nearest rank. */
export function quantile(sorted: ArrayLike<number>, q: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[rank] as number;
}

/** The median of an ascending sample (mean of the two middle values when the size is even). */
export function median(sorted: ArrayLike<number>): number {
  const n = sorted.length;
  if (n === 0) return Number.NaN;
  const mid = n >> 1;
  return n % 2 === 1 ? (sorted[mid] as number) : ((sorted[mid - 1] as number) + (sorted[mid] as number)) / 2;
}

export const ascending = (values: readonly number[]): Float64Array => Float64Array.from(values).sort();

/** A small seeded generator (mulberry32), so a bootstrap can be repeated exactly. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/**
 * Percentile bootstrap of median(b) − median(a): both samples resampled with replacement
 * `resamples` times; the interval holds the middle `level` of the differences.
 */
export function bootstrapMedianDifference(
  a: readonly number[],
  b: readonly number[],
  options: { resamples?: number; level?: number; seed?: number } = {},
): { difference: number; low: number; high: number } {
  const resamples = options.resamples ?? 2000;
  const level = options.level ?? 0.95;
  const random = seededRandom(options.seed ?? 1);
  const draw = (sample: readonly number[], into: Float64Array) => {
    for (let i = 0; i < into.length; i++) into[i] = sample[Math.floor(random() * sample.length)] as number;
    return median(into.sort());
  };
  const bufferA = new Float64Array(a.length);
  const bufferB = new Float64Array(b.length);
  const differences = new Float64Array(resamples);
  for (let r = 0; r < resamples; r++) differences[r] = draw(b, bufferB) - draw(a, bufferA);
  differences.sort();
  const tail = (1 - level) / 2;
  return {
    difference: median(ascending([...b])) - median(ascending([...a])),
    low: quantile(differences, tail),
    high: quantile(differences, 1 - tail),
  };
}

/** The Kolmogorov distribution's upper tail Q(λ) = 2 Σ (−1)^(j−1) exp(−2 j² λ²). */
export function kolmogorovQ(lambda: number): number {
  if (lambda < 1e-3) return 1;
  let sum = 0;
  for (let j = 1; j <= 100; j++) {
    const term = 2 * (j % 2 === 1 ? 1 : -1) * Math.exp(-2 * j * j * lambda * lambda);
    sum += term;
    if (Math.abs(term) < 1e-12) break;
  }
  return Math.min(1, Math.max(0, sum));
}

/**
 * Two-sample Kolmogorov–Smirnov test: D is the largest distance between the two empirical
 * distribution functions; p from the asymptotic distribution with Stephens' small-sample
 * correction (λ = (√nₑ + 0.12 + 0.11/√nₑ)·D, nₑ = n·m/(n+m)), accurate for samples of hundreds.
 */
export function kolmogorovSmirnov(a: readonly number[], b: readonly number[]): { d: number; p: number } {
  const x = ascending(a);
  const y = ascending(b);
  const n = x.length;
  const m = y.length;
  if (n === 0 || m === 0) return { d: Number.NaN, p: Number.NaN };
  let i = 0;
  let j = 0;
  let d = 0;
  while (i < n && j < m) {
    const value = Math.min(x[i] as number, y[j] as number);
    // Step past every copy of the value in both samples, so ties do not create a false gap.
    while (i < n && x[i] === value) i++;
    while (j < m && y[j] === value) j++;
    d = Math.max(d, Math.abs(i / n - j / m));
  }
  const en = Math.sqrt((n * m) / (n + m));
  return { d, p: kolmogorovQ((en + 0.12 + 0.11 / en) * d) };
}
