CREATE TABLE `billing_checkouts` (
	`checkout_id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`license_id` text NOT NULL,
	`offering_id` text NOT NULL,
	`subscription_id` text,
	`created_at` integer NOT NULL,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE TABLE `billing_claims` (
	`token_lookup` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`license_id` text NOT NULL,
	`created_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`redeemed_at` integer,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `billing_claims_license` ON `billing_claims` (`license_id`);--> statement-breakpoint
CREATE TABLE `billing_events` (
	`event_id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`type` text NOT NULL,
	`result` text NOT NULL,
	`reason` text,
	`license_id` text,
	`attempts` integer NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE `billing_integrations` (
	`environment` text PRIMARY KEY NOT NULL,
	`provider` text NOT NULL,
	`status` text NOT NULL,
	`api_key_ciphertext` text,
	`webhook_secret_ciphertext` text,
	`api_base_url` text NOT NULL,
	`claim_url_base` text,
	`secure_claims` integer NOT NULL,
	`last_event_id` text,
	`last_event_type` text,
	`last_event_result` text,
	`last_event_reason` text,
	`last_event_at` integer,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE TABLE `billing_offerings` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`price_id` text NOT NULL,
	`name` text,
	`product_id` text NOT NULL,
	`policy_id` text NOT NULL,
	`license_duration_days` integer,
	`status` text NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`policy_id`) REFERENCES `policies`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `billing_offerings_active_price` ON `billing_offerings` (`environment`,`price_id`) WHERE status = 'active';--> statement-breakpoint
CREATE TABLE `billing_subscriptions` (
	`environment` text NOT NULL,
	`subscription_id` text NOT NULL,
	`license_id` text,
	`paid_through` integer,
	`ends_at` integer,
	`updated_at` integer NOT NULL,
	PRIMARY KEY(`environment`, `subscription_id`),
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `billing_subscriptions_license` ON `billing_subscriptions` (`license_id`);