-- Key pairs (per user, by name), per-project quota limits that override the defaults
-- in the settings, and the key pair a server was created with.

CREATE TABLE key_pairs (
    id          BIGSERIAL PRIMARY KEY,
    user_id     TEXT NOT NULL,
    name        TEXT NOT NULL,
    type        TEXT NOT NULL CHECK (type IN ('ssh', 'x509')),
    public_key  TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (user_id, name)
);

CREATE TABLE quotas (
    project_id TEXT NOT NULL,
    resource   TEXT NOT NULL,
    hard_limit INTEGER NOT NULL CHECK (hard_limit >= -1),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ,
    PRIMARY KEY (project_id, resource)
);

ALTER TABLE instances ADD COLUMN key_name TEXT, ADD COLUMN key_data TEXT;

-- Usage reports look for instances alive during a period.
CREATE INDEX instances_launched ON instances (launched_at);
