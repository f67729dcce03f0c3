-- Servers created by one request (min_count / max_count) share a reservation id
-- (r-xxxxxxxx) and are numbered by their launch index, as in Nova. Older rows: NULL and 0.

ALTER TABLE instances
    ADD COLUMN reservation_id TEXT,
    ADD COLUMN launch_index INTEGER NOT NULL DEFAULT 0;

CREATE INDEX instances_reservation ON instances (reservation_id) WHERE reservation_id IS NOT NULL;
