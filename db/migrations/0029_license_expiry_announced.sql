ALTER TABLE `licenses` ADD `expiry_announced` integer;--> statement-breakpoint
-- The expiries the scan has not reached yet (after its mark) that the scan before this migration
-- would have skipped (changed at or after they passed, as a billing cancellation that ended the
-- license at once and announced it itself) stay skipped: nothing is announced twice on upgrade.
-- Read through licenses_expires; no mark (nothing ever subscribed): no rows.
UPDATE `licenses` SET `expiry_announced` = `expires_at`
WHERE `expires_at` > (SELECT `value` FROM `webhook_marks` WHERE `name` = 'license.expired')
  AND `updated_at` >= `expires_at`;
