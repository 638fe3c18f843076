-- Multi-unit purchase (issue 15 item 3): an order holds `quantity` units of its item
-- (one reservation per user per item, 1..=the activity's per_user_limit). Orders
-- written before this migration held one unit each.
ALTER TABLE orders ADD COLUMN IF NOT EXISTS quantity INT UNSIGNED NOT NULL DEFAULT 1 AFTER shard;
