-- A rotation by an older version that stopped between adding the new key and retiring the old one
-- left two active keys. The server signs with the first one inserted (lowest rowid), which is the
-- one the stored bundle lists; the later ones were never listed nor used, so they are retired as
-- already past their retention (never listed again). The operator's rotation had failed and is run again.
UPDATE `signing_keys` SET `status` = 'retired', `not_after` = `not_before`, `retired_at` = `created_at`
WHERE `status` = 'active' AND EXISTS (
  SELECT 1 FROM `signing_keys` AS `first`
  WHERE `first`.`product_id` = `signing_keys`.`product_id` AND `first`.`status` = 'active'
    AND `first`.`rowid` < `signing_keys`.`rowid`
);--> statement-breakpoint
CREATE UNIQUE INDEX `signing_keys_one_active` ON `signing_keys` (`product_id`) WHERE status = 'active';