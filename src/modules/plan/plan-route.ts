/** The plan report's path (src/modules/plan/index.ts mounts it here). */
export const PLAN_PATH = "/mgmt/v1/plan";
const PLAN_PATH_SLASH = `${PLAN_PATH}/`;

/**
 * Whether a request is served by the plan report, the one management route exempt from the
 * monthly allowance and from 402 PLAN_ENDED (spec §4.1, §4.3). Decided on the route the router
 * serves, not on the spelling: GET and HEAD (answered by the GET route), and the path with one
 * trailing slash, which the router serves as the same route (test/api/plan-ended.test.ts).
 */
export const isPlanReport = (method: string, path: string): boolean =>
  (method === "GET" || method === "HEAD") && (path === PLAN_PATH || path === PLAN_PATH_SLASH);
