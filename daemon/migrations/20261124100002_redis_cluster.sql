-- Hot-item isolation (issue 15): the named Redis Cluster an activity's stock lives on
-- (a `[redis.clusters.<name>]` of every daemon's config); '' = the default cluster.
-- stockd writes it into `sk:{a}:meta` (field `cluster`).
ALTER TABLE activities
    ADD COLUMN IF NOT EXISTS redis_cluster VARCHAR(32) NOT NULL DEFAULT '';
