-- source_off_at: when the source's agent, alive again, reported the guest of an
-- evacuation still under way shut down (it keeps such a guest off and never starts it):
-- the evacuation need not wait for that host's fence's lease any longer.
ALTER TABLE migrations ADD COLUMN source_off_at TIMESTAMPTZ;
