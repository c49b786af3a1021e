DROP INDEX `customers_email`;--> statement-breakpoint
CREATE INDEX `customers_email_lower` ON `customers` (lower("email"));