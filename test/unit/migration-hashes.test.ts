import { expect, test } from "bun:test";
import { embeddedMigrations } from "../../src/store/migrations.macro.ts";

/**
 * Every shipped migration's hash, as stores record it. A store refuses to start when a migration it
 * ran has another hash now (src/store/migrate.ts), and the hash covers the whole file, comments
 * too: a shipped migration must never change. One that did (0026, a comment in 388e61f) stopped
 * every store made in between from upgrading until its earlier hash was listed as superseded.
 * A new migration is added here when it ships; a changed one is a new migration instead.
 */
const SHIPPED: Record<string, string> = {
  "0000_initial": "be185a09fb8295ece769968f890914ec100abe5713274cbc807fa0493350faba",
  "0001_runtime_core": "42ddf37579d878bfde4d8701a3b43e86c7acf20a7bb465cedab7ceea4d10d7e8",
  "0002_usage_counters": "18b9c0a75018db21a42f31220d71db5fe6db86c54891b6dfc81bc8836d24ab2d",
  "0003_offline_and_sealed": "cca1ce5b12f3b5fd1c1e047f0c9d746c6ea78b396ef9eeefb353aeb192b13cdb",
  "0004_runtime_indexes": "eb9c59a0f897b542c85935bef86e2e42abdde4fe341127fd796a52b62d9ae23c",
  "0005_browser_runtime": "18bdd2bd8c03702ed00d177c41520e4e2a3c09296295eccd68df9acffc34cafc",
  "0006_trials": "e0aee76d0e56892b3a68de7f171574a69ba7083f1f1e99a5ed808dad27deb002",
  "0007_webhooks": "82e034be8e731d5d3320470be84046f75761f330be80d4f15435ce072a613bcd",
  "0008_billing": "e37965b107c77c0ea20c3c624c54640f0570f081595c2505c3552940788a33ce",
  "0009_plan_terms": "fdf3bbb29c47f12426424809fd2ec49cb1564cde11c17a818a4cfce36984c85c",
  "0010_named_users": "97f5f20b8ea2149d530f40fe3b52cf608634a589628101029ee8d2e3a0f7ff98",
  "0011_activation_counts": "ad0b3639471700ab741a98d389ee2f66a2202d14b0f859fc89322dba58544448",
  "0012_webhooks_retention": "3e6e11535b23afc5ab7bb6cb365ffbe642449764d101312e93b00b58686e92ee",
  "0013_passkeys": "1f5cf51b8faf15e931932f4662ee27a90af081f240958fdfd793fda81de01247",
  "0014_email_verification_limits": "f38c119da1777edca1184df42e1fee93ab7a310d55439cca7fe89f65d93c851a",
  "0015_billing_event_order": "d7b77a913e789ce48f2845b8fc5cee684e8350eae9e39650badc4d1a4bdd657d",
  "0016_lease_counts": "b83e459b16a97fc25200df95e38455e8839c90e62e4a3de70c5678c7b9fac445",
  "0017_nonces_without_rowid": "469b4dc9736249dd3557095d557a50eee9c78e4921c262da7372aaf64ab6fd5f",
  "0018_activation_indexes": "12ea58d4ea20f89a35f6757b990cfffe9cfef22b78f912e8adc338d0ed3956f8",
  "0019_policy_revision_trigger": "0aee40a10a1b239d9993ba8d7f9a5815ed23f4d131e01e53a043b8de4c5f3ce4",
  "0020_nonces_in_arrival_order": "a68f96b3367d7c07013fd26e9c15616643f329ff897db973c015e1f017f1a898",
  "0021_verification_latest_start": "f81d6b8fb4f360cdab28ab82341fc989ba6f52fbc72f2a19ba48b8496f2ba350",
  "0022_license_activations_newest": "38ff85d04296eae7dfd18a3ea53f2aeda2c8254bb7720caa1cb501a567c731a5",
  "0023_licenses_by_expiry": "d53a8956facb02c508460bd5e6486c6de107aaad647d4d412b1cc364915bb458",
  "0024_customers_email_lower": "40fda114e09f7029244025674b756c68630fdb77bda07a9bd5653aa741e4e4cc",
  "0025_device_index_status_first": "04d46827a32ae38558c4433b45ca17c359d34cc5f20aff2e004f88902d398539",
  "0026_verification_counted": "addb7b972656d9545d4ed40d7c692342ea23d6fed68a2c44580951427b20ee71",
  "0027_usage_report_covering": "8546b417369a2a6e0734baa787ca21b47cb57c7b30aa1f473d3e2a01ace88cc2",
  "0028_device_blocks_lifted": "002b044b1b23ed1354b57897ef3f9b0bee3d294ec9d2510b21536f0d9fc66153",
  "0029_license_expiry_announced": "13abb2b918937b0aa124967c6093b09c3f754326a6e88a2784228a673c1b732a",
  "0030_one_active_signing_key": "55802e481f56e8189622be328cd7071ac4bd0e55f7821d8b74079e577fba8a4a",
  "0031_trust_bundle_minimum_sequence": "9ffeaba2592a29caa6a04ebf179ec8758f7d722f2930d32b0a876824ae095820",
  "0032_offline_packages_signing_key": "bd3af05d9b662a68ee5ceef9cd13521b3df89edb31dea71491f05ee19d91fcd4",
  "0033_sealing_key_lifecycle": "8a8095f64f33087152a741dafd7789d45578184b4fd2469fd389db4816971049",
  "0034_lease_retention": "cad144d7bc067f27cc9d2a6bfb1f443a22af166fa169314e43ea9a6bf373c9c8",
  "0035_lease_month_count_progress": "e13022a183c175846ba2bc196128733ccc793f11466717f0d1fece807194a9d6",
  "0036_license_tallies": "a7935c051c1aff85863b08c4417612e6e054b0c06aa106319065d6fd7ac4668e",
  "0037_licenses_lifetime_index": "a492727e2544e3d6f40641eeeb026d0d224297893641b99fb8987cc272a4d0c3",
  "0038_server_base_url": "37b9dc7935e5f4123e5cc7badd9871eb33b2a0141b5e536cadd04a405ebfe090",
  "0039_webhook_deliveries_endpoint_due": "74fbfaac3fdc8fe9428ddfa98a1b3ef461ad79de984654cf6919db4817985382",
  "0040_billing_subscription_start": "5f6d73facba5c29ba5e3d1a79ffcbb5173bebeabb14e4e7de4bb39cd4fd0fa50",
  "0041_customers_external_ref": "f9e6665559e35ba75af035c7ecd29f6853e30cfb622a962e8f7ce5e8d125ca31",
  "0042_passkey_registrations_indexes": "3052ccb52aa39281ae7f424673d513e5bba89b4b45662aa879a7e547656457ea",
  "0043_license_state_history": "2b9292e98efeb320784d0115ff972cc710e9fae383f0538fa73fe893c87500c9",
  "0044_billing_ids_per_environment": "75d1ef622b5156ea4b89704405474e8a5fd85eec6eb43a9a66eb391886d63197",
};

test("no shipped migration has changed, and each new one is pinned here", () => {
  const now = Object.fromEntries(embeddedMigrations().map((m) => [m.tag, m.hash]));
  expect(now).toEqual(SHIPPED);
});
