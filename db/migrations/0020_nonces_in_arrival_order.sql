-- Device nonces get an integer key in arrival order and lose the seen_at index. Since 0017 that
-- index held (seen_at, activation_id, nonce): within a second, calls landed on random pages of it,
-- a second random page in every device call's commit next to the key's own. Now a call appends to
-- the table (a page the calls of one commit share) and writes one random page of the key index;
-- the purge deletes from the front of the table. Live nonces move in age order.
CREATE TABLE `device_nonces_new` (
	`id` integer PRIMARY KEY NOT NULL,
	`activation_id` text NOT NULL,
	`nonce` text NOT NULL,
	`seen_at` integer NOT NULL
);
--> statement-breakpoint
INSERT INTO `device_nonces_new` (`activation_id`, `nonce`, `seen_at`)
  SELECT `activation_id`, `nonce`, `seen_at` FROM `device_nonces` ORDER BY `seen_at`;
--> statement-breakpoint
DROP TABLE `device_nonces`;
--> statement-breakpoint
ALTER TABLE `device_nonces_new` RENAME TO `device_nonces`;
--> statement-breakpoint
CREATE UNIQUE INDEX `device_nonces_key` ON `device_nonces` (`activation_id`,`nonce`);
