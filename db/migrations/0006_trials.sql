CREATE TABLE `trial_grants` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`product_id` text NOT NULL,
	`license_id` text NOT NULL,
	`kind` text NOT NULL,
	`email_lookup` text NOT NULL,
	`device_thumbprint` text NOT NULL,
	`verification_id` text NOT NULL,
	`created_at` integer NOT NULL,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `trial_grants_product_email` ON `trial_grants` (`product_id`,`email_lookup`,`created_at`);--> statement-breakpoint
CREATE INDEX `trial_grants_product_device` ON `trial_grants` (`product_id`,`device_thumbprint`,`created_at`);--> statement-breakpoint
CREATE INDEX `trial_grants_product_created` ON `trial_grants` (`product_id`,`kind`,`created_at`);--> statement-breakpoint
CREATE TABLE `trial_signups` (
	`product_id` text PRIMARY KEY NOT NULL,
	`policy_id` text,
	`daily_limit` integer NOT NULL,
	`updated_at` integer NOT NULL,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`policy_id`) REFERENCES `policies`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE TABLE `trial_verifications` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`product_id` text NOT NULL,
	`email_lookup` text NOT NULL,
	`device_thumbprint` text NOT NULL,
	`code_hash` text NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`sent` integer NOT NULL,
	`status` text NOT NULL,
	`created_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`used_at` integer,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `trial_verifications_email` ON `trial_verifications` (`email_lookup`,`created_at`);--> statement-breakpoint
CREATE INDEX `trial_verifications_created` ON `trial_verifications` (`created_at`);