-- Resize: a cold migration with a new flavor. The record keeps both flavors, so the
-- destination is claimed and built with the new one and a revert restores the old one.
ALTER TABLE migrations ADD COLUMN old_flavor JSONB;
ALTER TABLE migrations ADD COLUMN new_flavor JSONB;
