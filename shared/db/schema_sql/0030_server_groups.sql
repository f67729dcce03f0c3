-- Server groups: a policy placing a set of servers relative to each other (affinity,
-- anti-affinity and their soft forms), and the servers in each. A server is in at most
-- one group, joined when it is created. Groups are deleted outright, as in Nova; a
-- deleted server leaves its group with it (members are read joined with live servers).

CREATE TABLE server_groups (
    id         BIGSERIAL PRIMARY KEY,
    uuid       UUID NOT NULL UNIQUE,
    name       TEXT NOT NULL,
    project_id TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    policy     TEXT NOT NULL
        CHECK (policy IN ('affinity', 'anti-affinity', 'soft-affinity', 'soft-anti-affinity')),
    -- {"max_server_per_host": N} for anti-affinity (microversion 2.64); {} otherwise.
    rules      JSONB NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX server_groups_project ON server_groups (project_id, id);

CREATE TABLE server_group_members (
    group_id      BIGINT NOT NULL REFERENCES server_groups (id) ON DELETE CASCADE,
    instance_uuid UUID NOT NULL UNIQUE,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, instance_uuid)
);
