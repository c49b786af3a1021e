CREATE TABLE `lease_counts` (
	`license_id` text PRIMARY KEY NOT NULL,
	`active` integer DEFAULT 0 NOT NULL,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
INSERT INTO `lease_counts` (`license_id`, `active`)
  SELECT `license_id`, count(*) FROM `leases` WHERE `status` = 'active' GROUP BY `license_id`;
--> statement-breakpoint
CREATE TRIGGER `lease_counts_insert` AFTER INSERT ON `leases` WHEN NEW.`status` = 'active'
BEGIN
  INSERT INTO `lease_counts` (`license_id`, `active`) VALUES (NEW.`license_id`, 1)
    ON CONFLICT (`license_id`) DO UPDATE SET `active` = `active` + 1;
END;
--> statement-breakpoint
CREATE TRIGGER `lease_counts_status` AFTER UPDATE OF `status`, `license_id` ON `leases`
WHEN (OLD.`status` = 'active') OR (NEW.`status` = 'active')
BEGIN
  UPDATE `lease_counts` SET `active` = `active` - 1
    WHERE OLD.`status` = 'active' AND `license_id` = OLD.`license_id`;
  INSERT INTO `lease_counts` (`license_id`, `active`)
    SELECT NEW.`license_id`, 1 WHERE NEW.`status` = 'active'
    ON CONFLICT (`license_id`) DO UPDATE SET `active` = `active` + 1;
END;
--> statement-breakpoint
CREATE TRIGGER `lease_counts_delete` AFTER DELETE ON `leases` WHEN OLD.`status` = 'active'
BEGIN
  UPDATE `lease_counts` SET `active` = `active` - 1 WHERE `license_id` = OLD.`license_id`;
END;
