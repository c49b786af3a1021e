ALTER TABLE `billing_subscriptions` ADD `state_event_at` integer;--> statement-breakpoint
ALTER TABLE `billing_subscriptions` ADD `state_event_id` text;--> statement-breakpoint
ALTER TABLE `billing_subscriptions` ADD `ended` integer DEFAULT false NOT NULL;