DROP INDEX `activations_license_device`;--> statement-breakpoint
CREATE INDEX `activations_license_device` ON `activations` (`license_id`,`status`,`device_thumbprint`);