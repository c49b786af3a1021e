-- Each Stripe checkout finds its buyer by the Stripe customer id in external_ref: without this, a
-- scan of every customer per purchase.
CREATE INDEX `customers_external_ref` ON `customers` (`external_ref`);