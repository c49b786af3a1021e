ALTER TABLE `email_verifications` ADD `code_failures` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `email_verifications` ADD `address_hash` text;--> statement-breakpoint
ALTER TABLE `email_verifications` ADD `sent` integer DEFAULT false NOT NULL;--> statement-breakpoint
CREATE INDEX `email_verifications_address` ON `email_verifications` (`address_hash`,`created_at`);--> statement-breakpoint
CREATE INDEX `email_verifications_user` ON `email_verifications` (`user_id`,`created_at`);--> statement-breakpoint
CREATE INDEX `email_verifications_created` ON `email_verifications` (`created_at`);--> statement-breakpoint
CREATE INDEX `named_user_tokens_expires` ON `named_user_tokens` (`expires_at`);