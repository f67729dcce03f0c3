-- Networks, subnets and security groups that projects create through the Networking
-- API, and servers on several networks.
--
-- A network row with a project is one a project created (the configured network has
-- none). Its subnet (at most one per network in keel) is kept on the same row: its id,
-- name and gateway, and the range servers get addresses from (first_address to
-- last_address, NULL until the subnet exists), with the pool's rows in fixed_ips as for
-- the configured network. A server may now hold several addresses of one network (the
-- same network requested twice), so the one-address-per-network index goes; position
-- is where the address was asked for in the create request, which addresses keep.
--
-- security_groups holds the groups projects create; every project's "default" group is
-- not a row (its id is derived from the project). A server is in its project's default
-- group unless instances_without_default_group names it, and in every created group
-- instance_security_groups pairs it with.

ALTER TABLE networks
    ADD COLUMN project_id TEXT,
    ADD COLUMN subnet_id UUID UNIQUE,
    ADD COLUMN subnet_name TEXT,
    ADD COLUMN gateway_ip INET,
    ALTER COLUMN cidr DROP NOT NULL,
    ALTER COLUMN first_address DROP NOT NULL,
    ALTER COLUMN last_address DROP NOT NULL;
CREATE INDEX networks_project ON networks (project_id) WHERE project_id IS NOT NULL;

DROP INDEX fixed_ips_instance_network;
ALTER TABLE fixed_ips ADD COLUMN position INTEGER;
CREATE INDEX fixed_ips_instance ON fixed_ips (instance_uuid) WHERE instance_uuid IS NOT NULL;

CREATE TABLE security_groups (
    id          UUID PRIMARY KEY,
    project_id  TEXT NOT NULL,
    name        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX security_groups_project ON security_groups (project_id, name);

CREATE TABLE instance_security_groups (
    instance_uuid UUID NOT NULL,
    group_id      UUID NOT NULL REFERENCES security_groups (id),
    added_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (instance_uuid, group_id)
);
CREATE INDEX instance_security_groups_group ON instance_security_groups (group_id);

CREATE TABLE instances_without_default_group (
    instance_uuid UUID PRIMARY KEY
);
