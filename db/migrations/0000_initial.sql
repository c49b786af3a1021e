CREATE TABLE `audit_events` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`type` text NOT NULL,
	`actor` text NOT NULL,
	`target_type` text NOT NULL,
	`target_id` text NOT NULL,
	`data` text NOT NULL,
	`request_id` text,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `audit_events_env_id` ON `audit_events` (`environment`,`id`);--> statement-breakpoint
CREATE TABLE `idempotency_records` (
	`scope` text NOT NULL,
	`method` text NOT NULL,
	`route` text NOT NULL,
	`idempotency_key` text NOT NULL,
	`fingerprint` text NOT NULL,
	`state` text NOT NULL,
	`response_status` integer,
	`response_body` text,
	`response_headers` text,
	`created_at` integer NOT NULL,
	`expires_at` integer NOT NULL,
	PRIMARY KEY(`scope`, `method`, `route`, `idempotency_key`)
);
--> statement-breakpoint
CREATE INDEX `idempotency_expires` ON `idempotency_records` (`expires_at`);--> statement-breakpoint
CREATE TABLE `policies` (
	`id` text PRIMARY KEY NOT NULL,
	`product_id` text NOT NULL,
	`environment` text NOT NULL,
	`name` text NOT NULL,
	`policy_number` integer DEFAULT 1 NOT NULL,
	`revision` integer DEFAULT 1 NOT NULL,
	`status` text NOT NULL,
	`license_type` text NOT NULL,
	`validation_mode` text NOT NULL,
	`fail_mode` text NOT NULL,
	`identity_mode` text NOT NULL,
	`perpetual_mode` text NOT NULL,
	`concurrency_unit` text NOT NULL,
	`renewal_authority` text NOT NULL,
	`billing_cycle` text NOT NULL,
	`fingerprint_profile` text NOT NULL,
	`heartbeat_required` integer NOT NULL,
	`max_machines` integer NOT NULL,
	`max_concurrent` integer,
	`license_unit_limit` integer,
	`cert_ttl_sec` integer NOT NULL,
	`heartbeat_sec` integer NOT NULL,
	`lease_ttl_sec` integer NOT NULL,
	`lease_heartbeat_sec` integer NOT NULL,
	`network_grace_sec` integer NOT NULL,
	`trial_days` integer NOT NULL,
	`entitlements` text NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	`retired_at` integer,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE INDEX `policies_env_id` ON `policies` (`environment`,`id`);--> statement-breakpoint
CREATE INDEX `policies_product` ON `policies` (`product_id`);--> statement-breakpoint
CREATE TABLE `products` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`name` text NOT NULL,
	`code` text NOT NULL,
	`description` text DEFAULT '' NOT NULL,
	`status` text NOT NULL,
	`trust_bundle_sequence` integer DEFAULT 0 NOT NULL,
	`signing_status` text NOT NULL,
	`version` integer DEFAULT 1 NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	`archived_at` integer
);
--> statement-breakpoint
CREATE UNIQUE INDEX `products_environment_code` ON `products` (`environment`,`code`);--> statement-breakpoint
CREATE INDEX `products_env_id` ON `products` (`environment`,`id`);--> statement-breakpoint
CREATE TABLE `licenses` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`product_id` text NOT NULL,
	`policy_id` text NOT NULL,
	`customer_id` text,
	`key_ciphertext` text NOT NULL,
	`key_lookup` text NOT NULL,
	`license_type` text NOT NULL,
	`status` text NOT NULL,
	`status_reason` text,
	`expires_at` integer,
	`renewal_authority` text NOT NULL,
	`max_machines_override` integer,
	`max_concurrent_override` integer,
	`license_unit_limit_override` integer,
	`entitlements` text NOT NULL,
	`metadata` text NOT NULL,
	`version` integer DEFAULT 1 NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	`suspended_at` integer,
	`revoked_at` integer,
	`converted_at` integer,
	FOREIGN KEY (`product_id`) REFERENCES `products`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`policy_id`) REFERENCES `policies`(`id`) ON UPDATE no action ON DELETE no action,
	FOREIGN KEY (`customer_id`) REFERENCES `customers`(`id`) ON UPDATE no action ON DELETE no action
);
--> statement-breakpoint
CREATE UNIQUE INDEX `licenses_key_lookup_unique` ON `licenses` (`key_lookup`);--> statement-breakpoint
CREATE INDEX `licenses_env_id` ON `licenses` (`environment`,`id`);--> statement-breakpoint
CREATE INDEX `licenses_customer` ON `licenses` (`customer_id`);--> statement-breakpoint
CREATE INDEX `licenses_policy` ON `licenses` (`policy_id`);--> statement-breakpoint
CREATE TABLE `customers` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text,
	`email` text,
	`external_ref` text,
	`notes` text,
	`status` text NOT NULL,
	`revision` integer DEFAULT 1 NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	`archived_at` integer
);
--> statement-breakpoint
CREATE INDEX `customers_email` ON `customers` (`email`);--> statement-breakpoint
CREATE TABLE `resellers` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text NOT NULL,
	`email` text,
	`external_ref` text,
	`status` text NOT NULL,
	`organization_limit` integer,
	`user_limit` integer,
	`metadata` text NOT NULL,
	`revision` integer DEFAULT 1 NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	`archived_at` integer
);
--> statement-breakpoint
CREATE TABLE `api_keys` (
	`id` text PRIMARY KEY NOT NULL,
	`environment` text NOT NULL,
	`name` text NOT NULL,
	`scopes` text NOT NULL,
	`token_hash` text NOT NULL,
	`token_hint` text NOT NULL,
	`created_at` integer NOT NULL,
	`revoked_at` integer,
	`last_used_at` integer,
	`usage_count` integer DEFAULT 0 NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `api_keys_token_hash_unique` ON `api_keys` (`token_hash`);--> statement-breakpoint
CREATE INDEX `api_keys_environment` ON `api_keys` (`environment`);--> statement-breakpoint
CREATE TABLE `workspace` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text NOT NULL,
	`plan_code` text NOT NULL,
	`created_at` integer NOT NULL,
	`updated_at` integer NOT NULL,
	CONSTRAINT "workspace_single_row" CHECK("workspace"."id" = 'default')
);
