DROP INDEX `device_blocks_target`;--> statement-breakpoint
ALTER TABLE `device_blocks` ADD `removed_at` integer;--> statement-breakpoint
CREATE UNIQUE INDEX `device_blocks_target` ON `device_blocks` (`environment`,`kind`,`target`) WHERE removed_at IS NULL;