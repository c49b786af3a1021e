DROP INDEX `activations_license_status`;--> statement-breakpoint
CREATE INDEX `activations_license_newest` ON `activations` (`license_id`,`id`);