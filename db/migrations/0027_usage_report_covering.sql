DROP INDEX `activations_env_activated`;--> statement-breakpoint
CREATE INDEX `activations_env_activated` ON `activations` (`environment`,`activated_at`,`deactivated_at`);