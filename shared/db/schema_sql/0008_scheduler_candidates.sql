-- The scheduler reads its best few candidate hosts in free-RAM order instead of every
-- host: this index lets that query stop after the rows it needs. The expression must
-- stay exactly as shared/db/host_candidates.py writes FREE_RAM_MB.
CREATE INDEX compute_nodes_free_ram
    ON compute_nodes ((memory_mb * ram_allocation_ratio - memory_mb_used) DESC, id)
    WHERE deleted_at IS NULL;

-- Server lists page by creation time (newest first) within a project or across all.
CREATE INDEX instances_created_live ON instances (created_at DESC, id DESC)
    WHERE deleted_at IS NULL;
CREATE INDEX instances_project_created_live ON instances (project_id, created_at DESC, id DESC)
    WHERE deleted_at IS NULL;

-- A compute node's service: the API joins nodes to the services it shows.
CREATE INDEX compute_nodes_service ON compute_nodes (service_id) WHERE deleted_at IS NULL;
