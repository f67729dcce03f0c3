-- Per-user quota limits within a project (os-quota-sets?user_id=): each overrides the
-- project's limit for that user's own servers and key pairs.

CREATE TABLE user_quotas (
    project_id TEXT NOT NULL,
    user_id    TEXT NOT NULL,
    resource   TEXT NOT NULL,
    hard_limit INTEGER NOT NULL CHECK (hard_limit >= -1),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ,
    PRIMARY KEY (project_id, user_id, resource)
);
