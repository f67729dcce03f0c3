-- soft_deleted_at: when a DELETE with soft delete on (KEEL_RECLAIM_INSTANCE_INTERVAL)
-- put the server in SOFT_DELETED; the conductors' reclaim sweep deletes it for good once
-- the interval has passed since. NULL in any other state (a restore clears it).
ALTER TABLE instances ADD COLUMN soft_deleted_at TIMESTAMPTZ;
CREATE INDEX instances_soft_deleted_at ON instances (soft_deleted_at)
    WHERE soft_deleted_at IS NOT NULL AND deleted_at IS NULL;
