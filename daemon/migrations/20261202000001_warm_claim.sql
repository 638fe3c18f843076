-- Who warms a not yet published activity from a snapshot (stockd's publish): the one
-- publish that set this while it was NULL. Every stockd of a fleet runs a scheduled
-- publish, and a second warm-up could land on a shard after the sale began there and its
-- node came back empty; the other publishes wait for the claimant, or rebuild.
ALTER TABLE activities ADD COLUMN warm_claimed_at DATETIME(3) NULL;
