CREATE TABLE `usage_counters` (
	`metric` text NOT NULL,
	`period` text NOT NULL,
	`count` integer DEFAULT 0 NOT NULL,
	PRIMARY KEY(`metric`, `period`)
);
