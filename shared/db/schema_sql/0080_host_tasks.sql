-- Host tasks: whole-host operations (drain, evacuate) the conductors carry out as
-- durable work (services/conductor/host_tasks/). The client that asked may exit; any
-- conductor may die: the rows say what is left, and every conductor's sweep goes on.
--
-- status: running → done (every server moved) or failed (with why, and what is left).
-- At most one running task per host: starting another resumes it.
CREATE TABLE host_tasks (
    id             BIGSERIAL PRIMARY KEY,
    uuid           UUID NOT NULL UNIQUE,
    kind           TEXT NOT NULL CHECK (kind IN ('drain', 'evacuate')),
    service_id     BIGINT NOT NULL REFERENCES services (id),
    host           TEXT NOT NULL,
    status         TEXT NOT NULL DEFAULT 'running'
                   CHECK (status IN ('running', 'done', 'failed')),
    -- At most this many of its servers moving at once.
    parallel       INTEGER NOT NULL CHECK (parallel > 0),
    -- Drain: whether a server may be moved cold (shut down, moved, started again) when
    -- it cannot be moved live. Live migration does not exist yet: a drain needs it.
    cold_fallback  BOOLEAN NOT NULL DEFAULT false,
    deadline       TIMESTAMPTZ NOT NULL,
    user_id        TEXT,
    project_id     TEXT,
    -- Why it failed, or what it waits for while it runs (one sentence, for an operator).
    message        TEXT,
    -- The conductor sweeping it now, until when (a lease taken by compare-and-swap, so
    -- one conductor at a time works on a task; a conductor that dies mid-pass only
    -- holds it until swept_until).
    swept_by       UUID,
    swept_until    TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    ended_at       TIMESTAMPTZ
);
CREATE UNIQUE INDEX host_tasks_one_running ON host_tasks (service_id) WHERE status = 'running';
CREATE INDEX host_tasks_running ON host_tasks (id) WHERE status = 'running';

-- One row per server of the task's host: pending → moving → moved, or failed (with
-- why) or skipped (it no longer needs moving: deleted, or moved away by someone else).
-- migration_uuid: the move the task started for it (set in the transaction that
-- records the move, so each server's move is started once whoever sweeps).
CREATE TABLE host_task_items (
    id              BIGSERIAL PRIMARY KEY,
    task_id         BIGINT NOT NULL REFERENCES host_tasks (id) ON DELETE CASCADE,
    instance_uuid   UUID NOT NULL,
    name            TEXT NOT NULL DEFAULT '',
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'moving', 'moved', 'failed', 'skipped')),
    migration_uuid  UUID,
    -- Where it went (moved), or why it failed or was skipped.
    dest            TEXT,
    message         TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (task_id, instance_uuid)
);
CREATE INDEX host_task_items_open ON host_task_items (task_id) WHERE status IN ('pending', 'moving');
