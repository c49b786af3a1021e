import { Type } from "@sinclair/typebox";
import { Elysia } from "elysia";
import { type AdjustableClock, unixSeconds } from "../domain/clock.ts";

/** The largest single step of the test clock: 100 years, beyond any license or plan window. */
const MAX_ADVANCE_SEC = 100 * 366 * 86_400;

/**
 * `POST /testing/v1/clock` (DESIGN §4 "Test clock"). Only ever mounted with --test-clock; without
 * the flag the route does not exist and the app answers 404.
 */
export const testClockRoutes = (clock: AdjustableClock) =>
  new Elysia({ name: "test-clock", normalize: false, detail: { hide: true } }).post(
    "/testing/v1/clock",
    ({ body }) => ({ data: { now: unixSeconds(clock.advance(body.advance_sec)) } }),
    {
      body: Type.Object(
        { advance_sec: Type.Integer({ minimum: 0, maximum: MAX_ADVANCE_SEC }) },
        { additionalProperties: false },
      ),
    },
  );
