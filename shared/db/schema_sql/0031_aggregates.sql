-- Host aggregates: named sets of compute hosts with metadata. Metadata
-- `availability_zone` puts the aggregate's hosts in that zone, as in Nova; other keys are
-- matched by the scheduler (flavor extra specs scoped `aggregate_instance_extra_specs:`,
-- project isolation by `filter_tenant_id`). Deleted aggregates keep their row.

CREATE TABLE aggregates (
    id         BIGSERIAL PRIMARY KEY,
    uuid       UUID NOT NULL UNIQUE,
    name       TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ,
    deleted_at TIMESTAMPTZ
);
CREATE UNIQUE INDEX aggregates_live_name ON aggregates (name) WHERE deleted_at IS NULL;

-- Hosts by their compute service (by id, so a renamed host stays in its aggregates).
CREATE TABLE aggregate_hosts (
    aggregate_id BIGINT NOT NULL REFERENCES aggregates (id) ON DELETE CASCADE,
    service_id   BIGINT NOT NULL REFERENCES services (id),
    PRIMARY KEY (aggregate_id, service_id)
);
CREATE INDEX aggregate_hosts_service ON aggregate_hosts (service_id);

CREATE TABLE aggregate_metadata (
    aggregate_id BIGINT NOT NULL REFERENCES aggregates (id) ON DELETE CASCADE,
    key          TEXT NOT NULL,
    value        TEXT NOT NULL,
    PRIMARY KEY (aggregate_id, key)
);

-- The zone an aggregate gives a compute service's host (NULL when none does).
CREATE FUNCTION keel_aggregate_zone(host_service BIGINT) RETURNS TEXT
LANGUAGE sql STABLE AS $$
    SELECT min(m.value)
      FROM aggregate_hosts h
      JOIN aggregates a ON a.id = h.aggregate_id AND a.deleted_at IS NULL
      JOIN aggregate_metadata m ON m.aggregate_id = a.id AND m.key = 'availability_zone'
     WHERE h.service_id = host_service
$$;

-- A node's zone is its aggregate's, else the one its agent reports (kept here, so the
-- node falls back to it when it leaves the aggregate).
ALTER TABLE compute_nodes ADD COLUMN reported_availability_zone TEXT;
UPDATE compute_nodes SET reported_availability_zone = availability_zone;
