CREATE TABLE `offline_packages` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`product_id` text NOT NULL,
	`license_id` text NOT NULL,
	`activation_id` text NOT NULL,
	`request_sha256` text NOT NULL,
	`requested_expires_at` integer,
	`assignment_id` text,
	`signing_key_id` text NOT NULL,
	`issued_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`package_sha256` text NOT NULL,
	`body` blob NOT NULL,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`activation_id`) REFERENCES `activations`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `offline_packages_request` ON `offline_packages` (`license_id`,`request_sha256`);--> statement-breakpoint
CREATE INDEX `offline_packages_activation` ON `offline_packages` (`activation_id`);--> statement-breakpoint
CREATE TABLE `sealing_keys` (
	`key_id` text PRIMARY KEY NOT NULL,
	`product_id` text NOT NULL,
	`environment` text NOT NULL,
	`public_key` text NOT NULL,
	`status` text NOT NULL,
	`created_at` integer NOT NULL,
	`retired_at` integer,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `sealing_keys_product` ON `sealing_keys` (`product_id`);--> statement-breakpoint
ALTER TABLE `activations` ADD `offline_until` integer;