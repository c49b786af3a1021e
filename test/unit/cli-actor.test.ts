import { describe, expect, test } from "bun:test";
import { cliActor } from "../../src/cli/shared.ts";

const PASSWD = [
  "root:x:0:0:root:/root:/bin/bash",
  "# a comment:x:1001:",
  "deploy:x:1001:1001:Deploy user:/home/deploy:/bin/sh",
  "",
].join("\n");

describe("the command line's audit actor", () => {
  test("it is $USER when set, with the uid beside it", () => {
    expect(cliActor({ env: { USER: "alice" }, uid: 1001, passwd: () => PASSWD })).toEqual({
      type: "cli",
      id: "alice",
      uid: 1001,
    });
  });

  test("a $USER naming someone else is only the name: the uid still says who ran the command", () => {
    for (const env of [{ USER: "ceo-alice" }, { LOGNAME: "root" }, { USERNAME: "deploy" }]) {
      const actor = cliActor({ env, uid: 4242, passwd: () => PASSWD });
      expect(actor).toEqual({ type: "cli", id: Object.values(env)[0] as string, uid: 4242 });
    }
  });

  test("without $USER it is the uid's passwd entry, as in containers, cron and systemd units", () => {
    expect(cliActor({ env: {}, uid: 1001, passwd: () => PASSWD })).toEqual({
      type: "cli",
      id: "deploy",
      uid: 1001,
    });
    expect(cliActor({ env: { USER: "" }, uid: 0, passwd: () => PASSWD })).toEqual({
      type: "cli",
      id: "root",
      uid: 0,
    });
  });

  test("a uid with no passwd entry, or no readable passwd, is named uid:<n>", () => {
    expect(cliActor({ env: {}, uid: 4242, passwd: () => PASSWD })).toEqual({
      type: "cli",
      id: "uid:4242",
      uid: 4242,
    });
    expect(cliActor({ env: {}, uid: 1001, passwd: () => null }).id).toBe("uid:1001");
  });

  test("a system without uids (Windows) records the name alone", () => {
    expect(cliActor({ env: { USERNAME: "alice" }, uid: null, passwd: () => null })).toEqual({
      type: "cli",
      id: "alice",
    });
    expect(cliActor({ env: {}, uid: null, passwd: () => null })).toEqual({ type: "cli", id: "unknown" });
  });

  test("with the process's own sources it never says unknown on a system with a uid, and carries that uid", () => {
    if (typeof process.getuid !== "function") return;
    expect(cliActor().id).not.toBe("unknown");
    expect(cliActor().uid).toBe(process.getuid());
  });
});
