-- Device nonces become a WITHOUT ROWID table: the (activation_id, nonce) key is the table itself,
-- so a device call inserts into two B-trees (the table and seen_at) instead of three (the rowid
-- table, the key's index, seen_at): one page fewer in every device call's commit.
CREATE TABLE `device_nonces_new` (
	`activation_id` text NOT NULL,
	`nonce` text NOT NULL,
	`seen_at` integer NOT NULL,
	PRIMARY KEY(`activation_id`, `nonce`)
) WITHOUT ROWID;
--> statement-breakpoint
INSERT INTO `device_nonces_new` (`activation_id`, `nonce`, `seen_at`)
  SELECT `activation_id`, `nonce`, `seen_at` FROM `device_nonces`;
--> statement-breakpoint
DROP TABLE `device_nonces`;
--> statement-breakpoint
ALTER TABLE `device_nonces_new` RENAME TO `device_nonces`;
--> statement-breakpoint
CREATE INDEX `device_nonces_seen` ON `device_nonces` (`seen_at`);
