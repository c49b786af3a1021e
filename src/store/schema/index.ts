export * from "./audit.ts";
export * from "./catalog.ts";
export * from "./licenses.ts";
export * from "./parties.ts";
export * from "./runtime.ts";
export * from "./sealed.ts";
export * from "./trust.ts";
export * from "./workspace.ts";
