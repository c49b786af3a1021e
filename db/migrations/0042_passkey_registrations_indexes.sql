-- Passkey registration links are ended per user (a new link, two-factor off, an address change)
-- and purged by expiry: without these, each is a scan of every link ever sent.
CREATE INDEX `passkey_registrations_user` ON `passkey_registrations` (`user_id`);--> statement-breakpoint
CREATE INDEX `passkey_registrations_expiry` ON `passkey_registrations` (`expires_at`);