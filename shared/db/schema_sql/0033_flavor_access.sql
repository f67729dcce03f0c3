-- Flavor access lists (os-flavor-access): the projects that may use a private flavor
-- besides admins.
CREATE TABLE flavor_projects (
    flavor_id  BIGINT NOT NULL REFERENCES flavors (id) ON DELETE CASCADE,
    project_id TEXT NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (flavor_id, project_id)
);
CREATE INDEX flavor_projects_project ON flavor_projects (project_id);
