-- The seckill MySQL (MariaDB) schema: MySQL is the record of stock and orders.
-- Redis is only the fast gate in front of it (see DESIGN.md, "Redis contract").

CREATE TABLE IF NOT EXISTS activities (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    title           VARCHAR(200)    NOT NULL,
    start_at        DATETIME(3)     NOT NULL,
    end_at          DATETIME(3)     NOT NULL,
    shard_count     INT UNSIGNED    NOT NULL,
    per_user_limit  INT UNSIGNED    NOT NULL DEFAULT 1,
    -- DRAFT, SCHEDULED or PUBLISHED.
    status          VARCHAR(16)     NOT NULL DEFAULT 'DRAFT',
    publish_at      DATETIME(3)     NULL,
    published_at    DATETIME(3)     NULL,
    version         BIGINT UNSIGNED NOT NULL DEFAULT 1,
    created_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id),
    KEY idx_activities_status_publish (status, publish_at),
    CONSTRAINT chk_activities_window CHECK (end_at > start_at),
    CONSTRAINT chk_activities_shards CHECK (shard_count BETWEEN 1 AND 1024)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS activity_items (
    id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    activity_id      BIGINT UNSIGNED NOT NULL,
    title            VARCHAR(200)    NOT NULL,
    price_cents      BIGINT          NOT NULL,
    sale_price_cents BIGINT          NOT NULL,
    -- Units put on sale.
    total_stock      INT UNSIGNED    NOT NULL,
    -- Units not yet taken by an active order: orderd decrements it under a
    -- `stock >= k` guard, a cancel gives the unit back. UNSIGNED: never below zero.
    stock            INT UNSIGNED    NOT NULL,
    version          BIGINT UNSIGNED NOT NULL DEFAULT 0,
    created_at       DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at       DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id),
    KEY idx_items_activity (activity_id),
    CONSTRAINT fk_items_activity FOREIGN KEY (activity_id) REFERENCES activities (id),
    CONSTRAINT chk_items_stock CHECK (stock <= total_stock)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

CREATE TABLE IF NOT EXISTS orders (
    -- The reservation id handed out by the Lua reserve script.
    id              VARCHAR(96)     NOT NULL,
    activity_id     BIGINT UNSIGNED NOT NULL,
    item_id         BIGINT UNSIGNED NOT NULL,
    user_id         VARCHAR(64)     NOT NULL,
    request_id      VARCHAR(64)     NOT NULL,
    shard           INT UNSIGNED    NOT NULL,
    amount_cents    BIGINT          NOT NULL,
    -- PENDING (awaiting payment), PAID, CANCELLED or FAILED.
    status          VARCHAR(16)     NOT NULL,
    -- 1 while the order holds a unit (PENDING or PAID), NULL otherwise, so the
    -- unique key below allows one active order per (user, activity, item) and
    -- any number of cancelled or failed ones (a re-buy after a cancel).
    active          TINYINT AS (IF(status IN ('PENDING', 'PAID'), 1, NULL)) PERSISTENT,
    pay_deadline    DATETIME(3)     NULL,
    paid_at         DATETIME(3)     NULL,
    cancelled_at    DATETIME(3)     NULL,
    provider_ref    VARCHAR(128)    NULL,
    failure_reason  VARCHAR(255)    NULL,
    reserved_at     DATETIME(3)     NOT NULL,
    created_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id),
    UNIQUE KEY uq_orders_active_buyer (user_id, activity_id, item_id, active),
    UNIQUE KEY uq_orders_provider_ref (provider_ref),
    KEY idx_orders_user (user_id, created_at),
    KEY idx_orders_item_status (item_id, status),
    KEY idx_orders_pending_deadline (status, pay_deadline)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- One row per change of an item's MySQL stock.
CREATE TABLE IF NOT EXISTS stock_log (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    item_id      BIGINT UNSIGNED NOT NULL,
    order_id     VARCHAR(96)     NULL,
    -- Negative when an order takes units, positive when a cancel returns them.
    delta        INT             NOT NULL,
    -- ORDER, CANCEL, TIMEOUT, REPAIR, ...
    reason       VARCHAR(32)     NOT NULL,
    created_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (id),
    KEY idx_stock_log_item (item_id, id),
    KEY idx_stock_log_order (order_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Stream entries that failed too many times; kept for inspection and replay.
CREATE TABLE IF NOT EXISTS dead_letters (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    stream          VARCHAR(128)    NOT NULL,
    entry_id        VARCHAR(64)     NOT NULL,
    reservation_id  VARCHAR(96)     NULL,
    payload         TEXT            NOT NULL,
    deliveries      INT UNSIGNED    NOT NULL,
    last_error      TEXT            NOT NULL,
    created_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    replayed_at     DATETIME(3)     NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_dead_letters_entry (stream, entry_id),
    KEY idx_dead_letters_replayed (replayed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Units to give back to Redis after a cancel or a failed order. Written in the same
-- transaction as the MySQL change; a relay calls the idempotent Release and marks
-- the row done, so a crash between MySQL and Redis neither loses nor doubles it.
CREATE TABLE IF NOT EXISTS stock_return_outbox (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    order_id      VARCHAR(96)     NOT NULL,
    activity_id   BIGINT UNSIGNED NOT NULL,
    item_id       BIGINT UNSIGNED NOT NULL,
    user_id       VARCHAR(64)     NOT NULL,
    reason        VARCHAR(32)     NOT NULL,
    attempts      INT UNSIGNED    NOT NULL DEFAULT 0,
    last_error    TEXT            NULL,
    created_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    done_at       DATETIME(3)     NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uq_outbox_order (order_id),
    KEY idx_outbox_pending (done_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;

-- Payment provider callbacks seen, for replay protection.
CREATE TABLE IF NOT EXISTS payment_callbacks (
    provider_ref   VARCHAR(128)    NOT NULL,
    order_id       VARCHAR(96)     NOT NULL,
    amount_cents   BIGINT          NOT NULL,
    timestamp_ms   BIGINT          NOT NULL,
    received_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    PRIMARY KEY (provider_ref)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
