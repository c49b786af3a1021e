CREATE TABLE `passkey_approvals` (
	`verification_id` text PRIMARY KEY NOT NULL,
	`secret_hash` text NOT NULL,
	`challenge` text,
	`code_hash` text,
	`used_at` integer
);
--> statement-breakpoint
CREATE TABLE `passkey_registrations` (
	`token_hash` text PRIMARY KEY NOT NULL,
	`user_id` text NOT NULL,
	`challenge` text,
	`expires_at` integer NOT NULL,
	`used_at` integer
);
--> statement-breakpoint
CREATE TABLE `passkeys` (
	`id` text PRIMARY KEY NOT NULL,
	`user_id` text NOT NULL,
	`credential_id` text NOT NULL,
	`public_key` text NOT NULL,
	`sign_count` integer NOT NULL,
	`created_at` integer NOT NULL,
	`last_used_at` integer,
	FOREIGN KEY (`user_id`) REFERENCES `license_users`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `passkeys_credential` ON `passkeys` (`credential_id`);--> statement-breakpoint
CREATE INDEX `passkeys_user` ON `passkeys` (`user_id`);