-- The checkout's starting expiry, kept so a cancellation undone before the first invoice restores it.
ALTER TABLE `billing_subscriptions` ADD `starting_end` integer;--> statement-breakpoint
-- A license made before this column kept its checkout's expiry only on itself: the best record of it.
UPDATE `billing_subscriptions` SET `starting_end` = (SELECT `expires_at` FROM `licenses` WHERE `licenses`.`id` = `billing_subscriptions`.`license_id`) WHERE `license_id` IS NOT NULL;
