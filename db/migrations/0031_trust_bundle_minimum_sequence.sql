ALTER TABLE `products` ADD `trust_bundle_minimum_sequence` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
-- Until now the integration config's minimum was the product's sequence at download. Which earlier
-- bundles listed a key not yet compromised is not recorded, so every existing product keeps the
-- current sequence as its floor: configs downloaded from now on ask for nothing older than they
-- did, and the floor only stays put through later rotations.
UPDATE `products` SET `trust_bundle_minimum_sequence` = `trust_bundle_sequence`;
