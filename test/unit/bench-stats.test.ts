import { describe, expect, test } from "bun:test";
import {
  ascending,
  bootstrapMedianDifference,
  kolmogorovQ,
  kolmogorovSmirnov,
  median,
  quantile,
  seededRandom,
} from "../bench/lib/stats.ts";

/** Normal deviates (Box–Muller) from a seeded generator, so every run sees the same samples. */
function normals(count: number, mean: number, sd: number, seed: number): number[] {
  const random = seededRandom(seed);
  return Array.from({ length: count }, () => {
    const u = 1 - random();
    return mean + sd * Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * random());
  });
}

describe("the timing bench's statistics", () => {
  test("quantiles use the nearest rank and the median averages the middle pair", () => {
    const sorted = ascending([5, 1, 4, 2, 3]);
    expect(median(sorted)).toBe(3);
    expect(median(ascending([4, 1, 3, 2]))).toBe(2.5);
    expect(quantile(sorted, 0.9)).toBe(5);
    expect(quantile(sorted, 0.2)).toBe(1);
  });

  test("the Kolmogorov tail matches the tabulated critical values", () => {
    // Q(1.358) = 0.05 and Q(1.628) = 0.01: the classic 5% and 1% points.
    expect(kolmogorovQ(1.358)).toBeCloseTo(0.05, 3);
    expect(kolmogorovQ(1.628)).toBeCloseTo(0.01, 3);
    expect(kolmogorovQ(0)).toBe(1);
  });

  test("two samples of one distribution are not told apart", () => {
    const result = kolmogorovSmirnov(normals(2000, 1, 0.1, 1), normals(2000, 1, 0.1, 2));
    expect(result.p).toBeGreaterThan(0.05);
    expect(result.d).toBeLessThan(0.05);
  });

  test("a shift of a fifth of a standard deviation is detected", () => {
    const result = kolmogorovSmirnov(normals(2000, 1, 0.1, 3), normals(2000, 1.02, 0.1, 4));
    expect(result.p).toBeLessThan(0.01);
  });

  test("ties across the samples do not make a distance", () => {
    expect(kolmogorovSmirnov([1, 1, 2, 2], [2, 1, 2, 1])).toEqual({ d: 0, p: 1 });
    expect(kolmogorovSmirnov([1, 2, 3], [4, 5, 6]).d).toBe(1);
  });

  test("the bootstrap interval covers a true difference of zero and excludes a real one", () => {
    const a = normals(2000, 1, 0.1, 5);
    const same = bootstrapMedianDifference(a, normals(2000, 1, 0.1, 6));
    expect(same.low).toBeLessThanOrEqual(0);
    expect(same.high).toBeGreaterThanOrEqual(0);
    const shifted = bootstrapMedianDifference(a, normals(2000, 1.05, 0.1, 7));
    expect(shifted.low).toBeGreaterThan(0);
    expect(shifted.difference).toBeGreaterThan(shifted.low);
    expect(shifted.difference).toBeLessThan(shifted.high);
  });
});
