-- Licenses not revoked, per environment and license type, kept by triggers (as activation_counts,
-- 0011): the plan's quotas read one row instead of counting every live license on each create.
-- And the license list's product and customer filters get indexes that also give its order.
CREATE TABLE `license_tallies` (
	`environment` text NOT NULL,
	`license_type` text NOT NULL,
	`unrevoked` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`environment`, `license_type`)
);
--> statement-breakpoint
INSERT INTO `license_tallies` (`environment`, `license_type`, `unrevoked`)
  SELECT `environment`, `license_type`, count(*) FROM `licenses` WHERE `status` <> 'revoked'
  GROUP BY `environment`, `license_type`;
--> statement-breakpoint
CREATE TRIGGER `license_tallies_insert` AFTER INSERT ON `licenses` WHEN NEW.`status` <> 'revoked'
BEGIN
  INSERT INTO `license_tallies` (`environment`, `license_type`, `unrevoked`)
    VALUES (NEW.`environment`, NEW.`license_type`, 1)
    ON CONFLICT (`environment`, `license_type`) DO UPDATE SET `unrevoked` = `unrevoked` + 1;
END;
--> statement-breakpoint
CREATE TRIGGER `license_tallies_update` AFTER UPDATE OF `status`, `environment`, `license_type` ON `licenses`
WHEN (OLD.`status` <> 'revoked') OR (NEW.`status` <> 'revoked')
BEGIN
  UPDATE `license_tallies` SET `unrevoked` = `unrevoked` - 1
    WHERE OLD.`status` <> 'revoked' AND `environment` = OLD.`environment`
      AND `license_type` = OLD.`license_type`;
  INSERT INTO `license_tallies` (`environment`, `license_type`, `unrevoked`)
    SELECT NEW.`environment`, NEW.`license_type`, 1 WHERE NEW.`status` <> 'revoked'
    ON CONFLICT (`environment`, `license_type`) DO UPDATE SET `unrevoked` = `unrevoked` + 1;
END;
--> statement-breakpoint
CREATE TRIGGER `license_tallies_delete` AFTER DELETE ON `licenses` WHEN OLD.`status` <> 'revoked'
BEGIN
  UPDATE `license_tallies` SET `unrevoked` = `unrevoked` - 1
    WHERE `environment` = OLD.`environment` AND `license_type` = OLD.`license_type`;
END;
--> statement-breakpoint
DROP INDEX `licenses_customer`;
--> statement-breakpoint
CREATE INDEX `licenses_env_product` ON `licenses` (`environment`,`product_id`,`id`);
--> statement-breakpoint
CREATE INDEX `licenses_env_customer` ON `licenses` (`environment`,`customer_id`,`id`);
