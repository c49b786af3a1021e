-- A month start's count into lease_month_counts in progress: the count walks the leases a chunk
-- per sweeper step (src/modules/leases/month-counts.ts) and keeps its position and partial counts
-- here, so a restart resumes it. Empty when no count is under way.
CREATE TABLE `lease_month_count_progress` (
	`at` integer PRIMARY KEY NOT NULL,
	`after_id` text NOT NULL,
	`through_id` text NOT NULL,
	`live` integer NOT NULL,
	`test` integer NOT NULL
);
