-- The proof-of-work challenge of an activity (issue 14): leading zero bits per
-- sub-puzzle the gateway asks before a purchase token; 0 = no challenge. stockd
-- writes it into `sk:{a}:meta` (field `challenge_bits`); the gateway's
-- `[challenge]` section may override it.
ALTER TABLE activities
    ADD COLUMN IF NOT EXISTS challenge_bits INT UNSIGNED NOT NULL DEFAULT 0;
