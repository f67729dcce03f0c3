-- Moves of instances between compute nodes: evacuations and cold migrations. The
-- nodes are linked by id; the host and node names are kept for display only (a host
-- may be renamed later).
CREATE TABLE migrations (
    id                BIGSERIAL PRIMARY KEY,
    uuid              UUID NOT NULL UNIQUE,
    instance_uuid     UUID NOT NULL,
    migration_type    TEXT NOT NULL
        CHECK (migration_type IN ('migration', 'resize', 'live-migration', 'evacuation')),
    status            TEXT NOT NULL,
    source_compute    TEXT,
    source_node       TEXT,
    source_compute_id BIGINT REFERENCES compute_nodes (id),
    dest_compute      TEXT,
    dest_node         TEXT,
    dest_compute_id   BIGINT REFERENCES compute_nodes (id),
    dest_host         TEXT,
    user_id           TEXT,
    project_id        TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ,
    deleted_at        TIMESTAMPTZ
);
-- What a returning agent asks at start-up: its node's evacuations by status.
CREATE INDEX migrations_source_type_status
    ON migrations (source_compute_id, migration_type, status) WHERE deleted_at IS NULL;
CREATE INDEX migrations_instance ON migrations (instance_uuid);
CREATE INDEX migrations_updated ON migrations (updated_at, id);
