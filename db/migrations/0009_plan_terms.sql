ALTER TABLE `workspace` ADD `plan_ends_at` integer;--> statement-breakpoint
ALTER TABLE `workspace` ADD `plan_trial` integer DEFAULT false NOT NULL;