-- Billing event ids and checkout ids are unique per environment, not across both: each mode has
-- its own signing secret, and whoever holds only the test one could otherwise send a test event
-- (or checkout) with a live one's id first, so that the live delivery answered "replayed" and made
-- nothing. SQLite cannot change a primary key in place, so both tables are copied into new ones
-- keyed (environment, id), every row kept; no foreign key points at either table. The partial
-- index counts the failed events not applied since, and billing_integrations keeps the last
-- failure, which `last_event` overwrites with the next delivery.
CREATE TABLE `__new_billing_checkouts` (
	`checkout_id` text NOT NULL,
	`environment` text NOT NULL,
	`license_id` text NOT NULL,
	`offering_id` text NOT NULL,
	`subscription_id` text,
	`created_at` integer NOT NULL,
	PRIMARY KEY(`environment`, `checkout_id`),
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
INSERT INTO `__new_billing_checkouts`("checkout_id", "environment", "license_id", "offering_id", "subscription_id", "created_at") SELECT "checkout_id", "environment", "license_id", "offering_id", "subscription_id", "created_at" FROM `billing_checkouts`;--> statement-breakpoint
DROP TABLE `billing_checkouts`;--> statement-breakpoint
ALTER TABLE `__new_billing_checkouts` RENAME TO `billing_checkouts`;--> statement-breakpoint
CREATE TABLE `__new_billing_events` (
	`event_id` text NOT NULL,
	`environment` text NOT NULL,
	`type` text NOT NULL,
	`result` text NOT NULL,
	`reason` text,
	`license_id` text,
	`attempts` integer NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	PRIMARY KEY(`environment`, `event_id`)
);
--> statement-breakpoint
INSERT INTO `__new_billing_events`("event_id", "environment", "type", "result", "reason", "license_id", "attempts", "created_at", "updated_at") SELECT "event_id", "environment", "type", "result", "reason", "license_id", "attempts", "created_at", "updated_at" FROM `billing_events`;--> statement-breakpoint
DROP TABLE `billing_events`;--> statement-breakpoint
ALTER TABLE `__new_billing_events` RENAME TO `billing_events`;--> statement-breakpoint
CREATE INDEX `billing_events_failed` ON `billing_events` (`environment`) WHERE result = 'failed';--> statement-breakpoint
ALTER TABLE `billing_integrations` ADD `last_failure_id` text;--> statement-breakpoint
ALTER TABLE `billing_integrations` ADD `last_failure_type` text;--> statement-breakpoint
ALTER TABLE `billing_integrations` ADD `last_failure_reason` text;--> statement-breakpoint
ALTER TABLE `billing_integrations` ADD `last_failure_at` integer;