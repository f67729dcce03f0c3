-- What a user says about a server besides its flavor and image: key/value metadata, a
-- free-text description, tags (searchable with the tags filters) and the user data a
-- guest reads at first boot (base64, as the client sent it).

ALTER TABLE instances
    ADD COLUMN metadata    JSONB NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN description TEXT,
    ADD COLUMN tags        TEXT[] NOT NULL DEFAULT '{}',
    ADD COLUMN user_data   TEXT;

CREATE INDEX instances_tags ON instances USING gin (tags);
