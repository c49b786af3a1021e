-- Every change to a policy raises its revision, whoever makes it: the service does so itself, and
-- this catches any other writer (an older or newer binary's migration, a hand-run UPDATE). The
-- runtime caches policy settings per revision (RuntimeGate.policyOf) and the ETag is built from it.
CREATE TRIGGER `policies_revision` AFTER UPDATE ON `policies`
WHEN NEW.`revision` = OLD.`revision`
BEGIN
  UPDATE `policies` SET `revision` = OLD.`revision` + 1 WHERE `id` = NEW.`id`;
END;
