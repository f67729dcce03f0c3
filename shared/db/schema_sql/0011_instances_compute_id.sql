-- Instances are linked to the compute node they run on by its id, as allocations already
-- are. host and node stay as what the API shows; routing follows compute_id
-- (instance -> compute node -> service -> compute.<service uuid>). Rows written by an
-- older release have no compute_id until `keel-manage db online-data-migrations` fills
-- it from their host and node names.
ALTER TABLE instances ADD COLUMN compute_id BIGINT REFERENCES compute_nodes (id);
CREATE INDEX instances_compute_live ON instances (compute_id) WHERE deleted_at IS NULL;
-- Rows the online data migration still has to look at.
CREATE INDEX instances_unlinked ON instances (id)
    WHERE compute_id IS NULL AND host IS NOT NULL AND deleted_at IS NULL;
