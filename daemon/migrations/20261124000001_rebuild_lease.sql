-- The rebuild lease of an activity (stockd): a MySQL named lock
-- `seckill.rebuild.<activity>` held for the rebuild, and this row's token, raised by
-- every holder, that fences the rebuild's writes to Redis (`lua/scripts/rebuild.lua`).
CREATE TABLE IF NOT EXISTS rebuild_leases (
    activity_id BIGINT UNSIGNED NOT NULL,
    token       BIGINT UNSIGNED NOT NULL,
    -- The stockd that took it last (`stockd-<pid>@<host>`), for operators.
    holder      VARCHAR(128)    NOT NULL,
    taken_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (activity_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- A rebuild reads one shard's orders (lost-reservation accounting, start-up check).
CREATE INDEX IF NOT EXISTS idx_orders_activity_shard ON orders (activity_id, shard);
