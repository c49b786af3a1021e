-- The base URL the last server on this store ran with, for command-line commands given none.
ALTER TABLE `workspace` ADD `base_url` text;