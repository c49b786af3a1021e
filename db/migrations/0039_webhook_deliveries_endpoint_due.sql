-- Each endpoint's due deliveries, oldest first, by a seek: the dispatcher asks whenever an attempt
-- ends, and a scan of every due row took 18 ms at 50,000.
CREATE INDEX `webhook_deliveries_endpoint_due` ON `webhook_deliveries` (`endpoint_id`,`status`,`next_attempt_at`,`id`);