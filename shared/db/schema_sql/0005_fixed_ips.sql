-- Fixed IPv4 addresses. A network (defined in keel-api's settings) gets one row per
-- address it can hand out, created when the network is first used: its network,
-- gateway (the first host address) and broadcast addresses never get a row. A server
-- holds an address when the row names it. The primary key means no two servers can
-- hold the same address; the partial unique index, that a server holds at most one
-- address per network. Free rows are found through their own partial index.

CREATE TABLE networks (
    id            UUID PRIMARY KEY,
    name          TEXT NOT NULL,
    cidr          CIDR NOT NULL,
    first_address INET NOT NULL,
    last_address  INET NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ
);

CREATE TABLE fixed_ips (
    network_id    UUID NOT NULL REFERENCES networks (id),
    address       INET NOT NULL,
    instance_uuid UUID,
    tag           TEXT,
    allocated_at  TIMESTAMPTZ,
    PRIMARY KEY (network_id, address)
);
CREATE UNIQUE INDEX fixed_ips_instance_network
    ON fixed_ips (instance_uuid, network_id) WHERE instance_uuid IS NOT NULL;
CREATE INDEX fixed_ips_free ON fixed_ips (network_id, address) WHERE instance_uuid IS NULL;
