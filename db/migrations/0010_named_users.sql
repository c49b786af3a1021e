CREATE TABLE `email_verifications` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`product_id` text NOT NULL,
	`subject_hash` text NOT NULL,
	`license_id` text,
	`user_id` text,
	`assignment_id` text,
	`device_thumbprint` text NOT NULL,
	`code_hash` text NOT NULL,
	`attempts` integer DEFAULT 0 NOT NULL,
	`expires_at` integer NOT NULL,
	`closed_at` integer,
	`closed_reason` text,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `email_verifications_subject` ON `email_verifications` (`subject_hash`,`closed_at`);--> statement-breakpoint
CREATE TABLE `license_assignments` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`license_id` text NOT NULL,
	`user_id` text NOT NULL,
	`status` text NOT NULL,
	`created_at` integer NOT NULL,
	`removed_at` integer,
	FOREIGN KEY (`user_id`) REFERENCES `license_users`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `license_assignments_active` ON `license_assignments` (`license_id`,`user_id`) WHERE status = 'active';--> statement-breakpoint
CREATE INDEX `license_assignments_user` ON `license_assignments` (`user_id`,`status`);--> statement-breakpoint
CREATE INDEX `license_assignments_license` ON `license_assignments` (`license_id`,`id`);--> statement-breakpoint
CREATE TABLE `license_users` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`email` text NOT NULL,
	`email_normalized` text NOT NULL,
	`name` text,
	`external_ref` text,
	`customer_id` text,
	`status` text NOT NULL,
	`totp_status` text NOT NULL,
	`totp_secret` text,
	`totp_last_step` integer,
	`second_factor_failures` integer DEFAULT 0 NOT NULL,
	`two_factor_locked_at` integer,
	`revision` integer DEFAULT 1 NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	`disabled_at` integer
);
--> statement-breakpoint
CREATE UNIQUE INDEX `license_users_active_email` ON `license_users` (`environment`,`email_normalized`) WHERE status = 'active';--> statement-breakpoint
CREATE INDEX `license_users_env_id` ON `license_users` (`environment`,`id`);--> statement-breakpoint
CREATE TABLE `named_user_activations` (
	`activation_id` text PRIMARY KEY NOT NULL,
	`assignment_id` text NOT NULL
);
--> statement-breakpoint
CREATE TABLE `named_user_tokens` (
	`token_hash` text PRIMARY KEY NOT NULL,
	`verification_id` text NOT NULL,
	`license_id` text NOT NULL,
	`user_id` text NOT NULL,
	`assignment_id` text NOT NULL,
	`device_thumbprint` text NOT NULL,
	`expires_at` integer NOT NULL,
	`used_at` integer
);
--> statement-breakpoint
CREATE TABLE `two_factor_recovery_codes` (
	`user_id` text NOT NULL,
	`code_hash` text NOT NULL,
	`used_at` integer,
	FOREIGN KEY (`user_id`) REFERENCES `license_users`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `recovery_codes_user_hash` ON `two_factor_recovery_codes` (`user_id`,`code_hash`);