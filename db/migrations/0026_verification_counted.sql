DROP INDEX `email_verifications_user`;--> statement-breakpoint
ALTER TABLE `email_verifications` ADD `counted` integer DEFAULT false NOT NULL;--> statement-breakpoint
-- Rows from before: a sent code was let through; an unsent one is taken as held back (they are
-- purged within two days, and the limits look back one). For that day, starts from before the
-- upgrade still differ between addresses with and without a user, as they did when made. The user
-- index served the old per-user wrong-code budget only.
UPDATE `email_verifications` SET `counted` = `sent`;--> statement-breakpoint
CREATE INDEX `email_verifications_subject_counted` ON `email_verifications` (`subject_hash`,`counted`,`created_at`);