-- The identity admin API: roles are rows of their own (any name, as Keystone's), a user
-- may hold several roles in a project, users and projects can be disabled and carry the
-- extra attributes Keystone keeps (email, description...), and a user may have no
-- password (then no password authenticates them).

CREATE TABLE roles (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    description TEXT,
    extra       JSONB NOT NULL DEFAULT '{}',
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
-- Role names are unique whatever their case, as clients look them up (Tempest, Rally).
CREATE UNIQUE INDEX roles_name ON roles (lower(name));

-- The roles Keystone's bootstrap makes, with the ids keel's tokens always gave them
-- (uuid5 of "role/<name>" in keel's namespace).
INSERT INTO roles (id, name) VALUES
    ('34cfa24b41055126adf15e94b4800797', 'admin'),
    ('60c7c84cee88549f82a03d4fe8af8401', 'manager'),
    ('3a5305ca0bd356f39b764237ff3717a7', 'member'),
    ('efed45c326da5bd381b72d9eb7500e1f', 'reader'),
    ('6b93d18eae855d0ead91979cfcb96ce3', 'service');

-- A role implies others, as Keystone's bootstrap sets them: admin > manager > member >
-- reader. A token carries the roles assigned and every role they imply.
CREATE TABLE implied_roles (
    prior_role_id   TEXT NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    implied_role_id TEXT NOT NULL REFERENCES roles (id) ON DELETE CASCADE,
    PRIMARY KEY (prior_role_id, implied_role_id)
);
INSERT INTO implied_roles (prior_role_id, implied_role_id) VALUES
    ('34cfa24b41055126adf15e94b4800797', '60c7c84cee88549f82a03d4fe8af8401'),
    ('60c7c84cee88549f82a03d4fe8af8401', '3a5305ca0bd356f39b764237ff3717a7'),
    ('3a5305ca0bd356f39b764237ff3717a7', 'efed45c326da5bd381b72d9eb7500e1f');

ALTER TABLE role_assignments ADD COLUMN role_id TEXT REFERENCES roles (id) ON DELETE CASCADE;
UPDATE role_assignments a SET role_id = r.id FROM roles r WHERE r.name = a.role;
ALTER TABLE role_assignments ALTER COLUMN role_id SET NOT NULL;
ALTER TABLE role_assignments DROP CONSTRAINT role_assignments_pkey;
ALTER TABLE role_assignments DROP COLUMN role;
ALTER TABLE role_assignments ADD PRIMARY KEY (user_id, project_id, role_id);
CREATE INDEX role_assignments_role ON role_assignments (role_id);

ALTER TABLE users ALTER COLUMN password_hash DROP NOT NULL;
ALTER TABLE users ADD COLUMN enabled BOOLEAN NOT NULL DEFAULT true;
ALTER TABLE users ADD COLUMN extra JSONB NOT NULL DEFAULT '{}';
-- A project deleted leaves its users without a default project, not dangling.
ALTER TABLE users DROP CONSTRAINT users_default_project_id_fkey;
ALTER TABLE users ADD CONSTRAINT users_default_project_id_fkey
    FOREIGN KEY (default_project_id) REFERENCES projects (id) ON DELETE SET NULL;

ALTER TABLE projects ADD COLUMN enabled BOOLEAN NOT NULL DEFAULT true;
ALTER TABLE projects ADD COLUMN extra JSONB NOT NULL DEFAULT '{}';
