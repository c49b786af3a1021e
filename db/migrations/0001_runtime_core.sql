CREATE TABLE `activations` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`product_id` text NOT NULL,
	`license_id` text NOT NULL,
	`status` text NOT NULL,
	`device_signing_key` text NOT NULL,
	`device_thumbprint` text NOT NULL,
	`device_kem_key` text NOT NULL,
	`machine_info` text NOT NULL,
	`machine_info_digest` text NOT NULL,
	`machine_baseline_at` integer NOT NULL,
	`machine_signals` text NOT NULL,
	`app_version` text,
	`sdk_version` text,
	`activated_at` integer NOT NULL,
	`last_seen_at` integer NOT NULL,
	`last_heartbeat_at` integer,
	`certificate_expires_at` integer NOT NULL,
	`deactivated_at` integer,
	`deactivation_reason` text,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `activations_license_status` ON `activations` (`license_id`,`status`);--> statement-breakpoint
CREATE INDEX `activations_env_id` ON `activations` (`environment`,`id`);--> statement-breakpoint
CREATE INDEX `activations_device` ON `activations` (`device_thumbprint`);--> statement-breakpoint
CREATE TABLE `device_blocks` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`kind` text NOT NULL,
	`target` text NOT NULL,
	`reason` text,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `device_blocks_target` ON `device_blocks` (`environment`,`kind`,`target`);--> statement-breakpoint
CREATE TABLE `device_nonces` (
	`activation_id` text NOT NULL,
	`nonce` text NOT NULL,
	`seen_at` integer NOT NULL,
	PRIMARY KEY(`activation_id`, `nonce`)
);
--> statement-breakpoint
CREATE INDEX `device_nonces_seen` ON `device_nonces` (`seen_at`);--> statement-breakpoint
CREATE TABLE `leases` (
	`id` text PRIMARY KEY NOT NULL,
	`license_id` text NOT NULL,
	`activation_id` text NOT NULL,
	`instance_id` text NOT NULL,
	`status` text NOT NULL,
	`created_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	`released_at` integer,
	FOREIGN KEY (`license_id`) REFERENCES `licenses`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`activation_id`) REFERENCES `activations`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `leases_license_status` ON `leases` (`license_id`,`status`,`expires_at`);--> statement-breakpoint
CREATE TABLE `runtime_events` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`hour` integer NOT NULL,
	`operation` text NOT NULL,
	`code` text NOT NULL,
	`http_status` integer NOT NULL,
	`product_id` text,
	`license_id` text,
	`activation_id` text,
	`details_omitted` integer NOT NULL,
	`occurrences` integer NOT NULL,
	`first_occurred_at` integer NOT NULL,
	`last_occurred_at` integer NOT NULL,
	`last_request_id` text NOT NULL,
	`bucket` text NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `runtime_events_bucket` ON `runtime_events` (`bucket`);--> statement-breakpoint
CREATE INDEX `runtime_events_env_last` ON `runtime_events` (`environment`,`last_occurred_at`);--> statement-breakpoint
CREATE INDEX `runtime_events_hour` ON `runtime_events` (`hour`);--> statement-breakpoint
CREATE TABLE `signing_keys` (
	`key_id` text PRIMARY KEY NOT NULL,
	`product_id` text NOT NULL,
	`public_key` text NOT NULL,
	`status` text NOT NULL,
	`not_before` integer NOT NULL,
	`not_after` integer,
	`created_at` integer NOT NULL,
	`retired_at` integer,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `signing_keys_product` ON `signing_keys` (`product_id`);--> statement-breakpoint
CREATE TABLE `trust_bundles` (
	`product_id` text PRIMARY KEY NOT NULL,
	`sequence` integer NOT NULL,
	`bundle` text NOT NULL,
	`root_signature` text NOT NULL,
	`issued_at` integer NOT NULL,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action
);
