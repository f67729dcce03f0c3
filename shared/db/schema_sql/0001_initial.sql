-- The first schema of keel. Instances are linked to their host by the host and node
-- name strings (the classic linkage); compute nodes already point at their service by id.

CREATE TABLE services (
    id              BIGSERIAL PRIMARY KEY,
    uuid            UUID NOT NULL UNIQUE,
    host            TEXT NOT NULL,
    "binary"        TEXT NOT NULL,
    topic           TEXT NOT NULL,
    version         INTEGER NOT NULL DEFAULT 0,
    disabled        BOOLEAN NOT NULL DEFAULT false,
    disabled_reason TEXT,
    forced_down     BOOLEAN NOT NULL DEFAULT false,
    last_seen_up    TIMESTAMPTZ,
    report_count    BIGINT NOT NULL DEFAULT 0,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ,
    deleted_at      TIMESTAMPTZ
);
CREATE UNIQUE INDEX services_host_binary_live ON services (host, "binary") WHERE deleted_at IS NULL;

CREATE TABLE compute_nodes (
    id                   BIGSERIAL PRIMARY KEY,
    uuid                 UUID NOT NULL UNIQUE,
    service_id           BIGINT REFERENCES services (id),
    host                 TEXT NOT NULL,
    hypervisor_hostname  TEXT NOT NULL,
    hypervisor_type      TEXT NOT NULL DEFAULT 'keel',
    availability_zone    TEXT NOT NULL DEFAULT 'nova',
    vcpus                INTEGER NOT NULL CHECK (vcpus >= 0),
    memory_mb            INTEGER NOT NULL CHECK (memory_mb >= 0),
    local_gb             INTEGER NOT NULL CHECK (local_gb >= 0),
    vcpus_used           INTEGER NOT NULL DEFAULT 0 CHECK (vcpus_used >= 0),
    memory_mb_used       INTEGER NOT NULL DEFAULT 0 CHECK (memory_mb_used >= 0),
    local_gb_used        INTEGER NOT NULL DEFAULT 0 CHECK (local_gb_used >= 0),
    running_vms          INTEGER NOT NULL DEFAULT 0 CHECK (running_vms >= 0),
    cpu_allocation_ratio  DOUBLE PRECISION NOT NULL DEFAULT 1.0 CHECK (cpu_allocation_ratio > 0),
    ram_allocation_ratio  DOUBLE PRECISION NOT NULL DEFAULT 1.0 CHECK (ram_allocation_ratio > 0),
    disk_allocation_ratio DOUBLE PRECISION NOT NULL DEFAULT 1.0 CHECK (disk_allocation_ratio > 0),
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at           TIMESTAMPTZ,
    deleted_at           TIMESTAMPTZ
);
CREATE UNIQUE INDEX compute_nodes_host_node_live
    ON compute_nodes (host, hypervisor_hostname) WHERE deleted_at IS NULL;

CREATE TABLE flavors (
    id           BIGSERIAL PRIMARY KEY,
    flavorid     TEXT NOT NULL,
    name         TEXT NOT NULL,
    vcpus        INTEGER NOT NULL CHECK (vcpus > 0),
    memory_mb    INTEGER NOT NULL CHECK (memory_mb > 0),
    root_gb      INTEGER NOT NULL CHECK (root_gb >= 0),
    ephemeral_gb INTEGER NOT NULL DEFAULT 0 CHECK (ephemeral_gb >= 0),
    swap         INTEGER NOT NULL DEFAULT 0 CHECK (swap >= 0),
    rxtx_factor  DOUBLE PRECISION NOT NULL DEFAULT 1.0,
    is_public    BOOLEAN NOT NULL DEFAULT true,
    disabled     BOOLEAN NOT NULL DEFAULT false,
    description  TEXT,
    extra_specs  JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ,
    deleted_at   TIMESTAMPTZ
);
CREATE UNIQUE INDEX flavors_flavorid_live ON flavors (flavorid) WHERE deleted_at IS NULL;
CREATE UNIQUE INDEX flavors_name_live ON flavors (name) WHERE deleted_at IS NULL;

CREATE TABLE images (
    id               UUID PRIMARY KEY,
    name             TEXT,
    status           TEXT NOT NULL DEFAULT 'active',
    visibility       TEXT NOT NULL DEFAULT 'public',
    disk_format      TEXT,
    container_format TEXT,
    min_disk         INTEGER NOT NULL DEFAULT 0 CHECK (min_disk >= 0),
    min_ram          INTEGER NOT NULL DEFAULT 0 CHECK (min_ram >= 0),
    size             BIGINT,
    owner            TEXT,
    properties       JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ,
    deleted_at       TIMESTAMPTZ
);

CREATE TABLE instances (
    id                BIGSERIAL PRIMARY KEY,
    uuid              UUID NOT NULL UNIQUE,
    project_id        TEXT NOT NULL,
    user_id           TEXT NOT NULL,
    display_name      TEXT NOT NULL,
    host              TEXT,
    node              TEXT,
    vm_state          TEXT NOT NULL,
    task_state        TEXT,
    power_state       INTEGER NOT NULL DEFAULT 0,
    flavor            JSONB NOT NULL,
    image_ref         TEXT NOT NULL DEFAULT '',
    availability_zone TEXT,
    fault             JSONB,
    launched_at       TIMESTAMPTZ,
    terminated_at     TIMESTAMPTZ,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ,
    deleted_at        TIMESTAMPTZ
);
CREATE INDEX instances_host_live ON instances (host) WHERE deleted_at IS NULL;
CREATE INDEX instances_project_live ON instances (project_id) WHERE deleted_at IS NULL;

CREATE TABLE request_specs (
    id            BIGSERIAL PRIMARY KEY,
    instance_uuid UUID NOT NULL UNIQUE,
    spec          JSONB NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ
);

-- A resource claim: what one instance holds on one compute node. The node's *_used
-- columns are the sum of its allocations, kept in step in the same transaction.
CREATE TABLE allocations (
    id              BIGSERIAL PRIMARY KEY,
    instance_uuid   UUID NOT NULL,
    compute_node_id BIGINT NOT NULL REFERENCES compute_nodes (id),
    vcpus           INTEGER NOT NULL CHECK (vcpus >= 0),
    memory_mb       INTEGER NOT NULL CHECK (memory_mb >= 0),
    local_gb        INTEGER NOT NULL CHECK (local_gb >= 0),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (instance_uuid, compute_node_id)
);

CREATE TABLE instance_actions (
    id            BIGSERIAL PRIMARY KEY,
    instance_uuid UUID NOT NULL,
    action        TEXT NOT NULL,
    request_id    TEXT,
    user_id       TEXT,
    project_id    TEXT,
    message       TEXT,
    start_time    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finish_time   TIMESTAMPTZ
);
CREATE INDEX instance_actions_instance ON instance_actions (instance_uuid);
