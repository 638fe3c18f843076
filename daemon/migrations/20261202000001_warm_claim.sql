-- Who warms a not yet published activity from a snapshot (stockd's publish), and until
-- when: the one publish that set this while it was NULL, to MySQL's NOW(3) plus that
-- stockd's takeover time. Every stockd of a fleet runs a scheduled publish, and a second
-- warm-up could land on a shard after the sale began there and its node came back empty;
-- the other publishes wait for the claimant, or take over once this time has passed.
ALTER TABLE activities ADD COLUMN warm_claim_until DATETIME(3) NULL;
