-- Guests an agent found on its host whose instance the database places elsewhere (or
-- does not know), with no move that explains them. keel never destroys them; an
-- operator decides (keel-manage compute orphans).
CREATE TABLE orphaned_guests (
    compute_node_id BIGINT NOT NULL REFERENCES compute_nodes (id),
    instance_uuid   UUID NOT NULL,
    reason          TEXT NOT NULL,
    first_seen      TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen       TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (compute_node_id, instance_uuid)
);
