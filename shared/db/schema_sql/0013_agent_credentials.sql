-- Broker credentials made for compute agents (keel-manage agent credentials HOST). The
-- broker user is named after the agent's service UUID; for a host that has not registered
-- yet, this row reserves that UUID, and the agent's service is created with it.
CREATE TABLE agent_credentials (
    service_uuid UUID PRIMARY KEY,
    host         TEXT NOT NULL,
    broker_user  TEXT NOT NULL UNIQUE,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ
);
CREATE INDEX agent_credentials_host ON agent_credentials (host);
