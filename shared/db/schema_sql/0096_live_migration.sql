-- Live migration: whether the operator forced its host past the scheduler's filters
-- (compute microversions 2.30 to 2.67), whether force-complete was asked while its
-- memory was copied (2.22), and the copy's progress as the source reports it (2.23).
ALTER TABLE migrations ADD COLUMN forced BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE migrations ADD COLUMN force_complete BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE migrations ADD COLUMN memory_total_bytes BIGINT;
ALTER TABLE migrations ADD COLUMN memory_processed_bytes BIGINT;
ALTER TABLE migrations ADD COLUMN memory_remaining_bytes BIGINT;
ALTER TABLE migrations ADD COLUMN disk_total_bytes BIGINT;
ALTER TABLE migrations ADD COLUMN disk_processed_bytes BIGINT;
ALTER TABLE migrations ADD COLUMN disk_remaining_bytes BIGINT;
