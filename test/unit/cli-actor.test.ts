import { describe, expect, test } from "bun:test";
import { cliActor } from "../../src/cli/shared.ts";

const PASSWD = [
  "root:x:0:0:root:/root:/bin/bash",
  "# a comment:x:1001:",
  "deploy:x:1001:1001:Deploy user:/home/deploy:/bin/sh",
  "",
].join("\n");

describe("the command line's audit actor", () => {
  test("it is $USER when set", () => {
    expect(cliActor({ env: { USER: "alice" }, uid: 1001, passwd: () => PASSWD })).toEqual({
      type: "cli",
      id: "alice",
    });
  });

  test("without $USER it is the uid's passwd entry, as in containers, cron and systemd units", () => {
    expect(cliActor({ env: {}, uid: 1001, passwd: () => PASSWD })).toEqual({ type: "cli", id: "deploy" });
    expect(cliActor({ env: { USER: "" }, uid: 0, passwd: () => PASSWD }).id).toBe("root");
  });

  test("a uid with no passwd entry, or no readable passwd, is named uid:<n>", () => {
    expect(cliActor({ env: {}, uid: 4242, passwd: () => PASSWD }).id).toBe("uid:4242");
    expect(cliActor({ env: {}, uid: 1001, passwd: () => null }).id).toBe("uid:1001");
  });

  test("with the process's own sources it never says unknown on a system with a uid", () => {
    if (typeof process.getuid !== "function") return;
    expect(cliActor().id).not.toBe("unknown");
  });
});
