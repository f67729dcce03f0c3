-- Identity: projects, users with a slowly hashed password, the role each user holds in
-- a project, and the tokens issued to them (stored as a hash, never in the clear).

CREATE TABLE projects (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id                  TEXT PRIMARY KEY,
    name                TEXT NOT NULL UNIQUE,
    password_hash       TEXT NOT NULL,
    default_project_id  TEXT REFERENCES projects (id),
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    password_changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One role per user and project; admin implies member.
CREATE TABLE role_assignments (
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    role       TEXT NOT NULL CHECK (role IN ('member', 'admin')),
    PRIMARY KEY (user_id, project_id)
);
CREATE INDEX role_assignments_project ON role_assignments (project_id);

CREATE TABLE identity_tokens (
    token_hash BYTEA PRIMARY KEY,
    user_id    TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    audit_id   TEXT NOT NULL,
    issued_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX identity_tokens_expiry ON identity_tokens (expires_at);
CREATE INDEX identity_tokens_user ON identity_tokens (user_id);
