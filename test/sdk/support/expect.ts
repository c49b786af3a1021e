import { expect } from "bun:test";
import { SdkError } from "../../../src/sdk/index.ts";

/** Runs fn and returns the SdkError it throws; fails the test when it throws nothing else. */
export function catchSdk(fn: () => unknown): SdkError {
  try {
    fn();
  } catch (error) {
    expect(error).toBeInstanceOf(SdkError);
    return error as SdkError;
  }
  throw new Error("expected an SdkError, nothing was thrown");
}

export async function rejectsSdk(promise: Promise<unknown>): Promise<SdkError> {
  try {
    await promise;
  } catch (error) {
    if (!(error instanceof SdkError)) throw error;
    return error;
  }
  throw new Error("expected an SdkError, the promise resolved");
}

export function expectCode(fn: () => unknown, code: string): SdkError {
  const error = catchSdk(fn);
  expect(error.code).toBe(code);
  return error;
}
