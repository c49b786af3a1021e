-- Seats held at each month start, per environment: the usage report's past months, counted once
-- before the leases they count may be deleted (src/modules/leases/retention.ts). Filled by the
-- sweeper, not here: counting every past month of a large store would hold the upgrade.
CREATE TABLE `lease_month_counts` (
	`environment` text NOT NULL,
	`at` integer NOT NULL,
	`active` integer NOT NULL,
	PRIMARY KEY(`environment`, `at`)
);
