-- Self-fencing agents and automatic evacuation.
--
-- self_fence_after: the seconds a compute agent goes without a successful heartbeat
-- before it powers its guests off, as it last reported it (0: it never does; NULL: its
-- release does not report it, so it never counts as fenced unless forced down).
ALTER TABLE services ADD COLUMN self_fence_after DOUBLE PRECISION;

-- One row per fenced host whose servers the conductors started evacuating on their own
-- (KEEL_RECOVERY__AUTO_EVACUATE): what paces them (KEEL_RECOVERY__HOSTS_PER_MINUTE) and
-- what an operator reads afterwards.
CREATE TABLE host_recoveries (
    id            BIGSERIAL PRIMARY KEY,
    service_id    BIGINT NOT NULL REFERENCES services (id),
    host          TEXT NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    evacuations   INTEGER NOT NULL DEFAULT 0,
    skipped       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX host_recoveries_started ON host_recoveries (started_at);
