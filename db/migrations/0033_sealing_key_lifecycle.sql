ALTER TABLE `sealing_keys` ADD `is_current` integer DEFAULT false NOT NULL;--> statement-breakpoint
-- Until now a product had one sealing key, its active one, which the status route showed and new
-- files were sealed to: it becomes the current key. Should a product hold more than one active
-- key (nothing ever made two), the one the server used is kept current: the first inserted
-- (lowest rowid), which its read by product and status returned; the others keep releasing.
UPDATE `sealing_keys` SET `is_current` = 1
WHERE `status` = 'active' AND NOT EXISTS (
  SELECT 1 FROM `sealing_keys` AS `first`
  WHERE `first`.`product_id` = `sealing_keys`.`product_id` AND `first`.`status` = 'active'
    AND `first`.`rowid` < `sealing_keys`.`rowid`
);--> statement-breakpoint
CREATE UNIQUE INDEX `sealing_keys_one_current` ON `sealing_keys` (`product_id`) WHERE is_current = 1;
