-- What a license's suspension and expiry were before each change (the first change per license and
-- calendar month), so the usage report counts a past month's active licenses as they were at its
-- end: a reinstatement or renewal since overwrote that in `licenses`. Kept by a trigger, so no code
-- path can forget it. A change at exactly a month's first millisecond belongs to the month before
-- (the report counts a change at its moment as made), hence `updated_at - 1`.
CREATE TABLE `license_state_history` (
	`license_id` text NOT NULL,
	`changed_at` integer NOT NULL,
	`suspended_at` integer,
	`expires_at` integer,
	PRIMARY KEY(`license_id`, `changed_at`)
);
--> statement-breakpoint
CREATE INDEX `license_state_history_changed` ON `license_state_history` (`changed_at`);
--> statement-breakpoint
CREATE TRIGGER `license_state_history_update` AFTER UPDATE OF `suspended_at`, `expires_at` ON `licenses`
WHEN (OLD.`suspended_at` IS NOT NEW.`suspended_at` OR OLD.`expires_at` IS NOT NEW.`expires_at`)
  AND NOT EXISTS (
    SELECT 1 FROM `license_state_history` WHERE `license_id` = OLD.`id`
      AND `changed_at` > CAST(strftime('%s', (NEW.`updated_at` - 1) / 1000, 'unixepoch', 'start of month') AS INTEGER) * 1000
  )
BEGIN
  INSERT OR IGNORE INTO `license_state_history` (`license_id`, `changed_at`, `suspended_at`, `expires_at`)
    VALUES (OLD.`id`, NEW.`updated_at`, OLD.`suspended_at`, OLD.`expires_at`);
END;
