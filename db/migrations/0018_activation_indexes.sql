DROP INDEX `activations_env_id`;--> statement-breakpoint
DROP INDEX `activations_device`;--> statement-breakpoint
CREATE INDEX `activations_env_activated` ON `activations` (`environment`,`activated_at`);