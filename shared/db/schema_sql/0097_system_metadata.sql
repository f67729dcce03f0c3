-- What keel keeps about a server for itself, as Nova's system metadata: a shelved
-- server's image, when it was shelved and on which host (shelved_image_id, shelved_at,
-- shelved_host). Never shown to its owner.
ALTER TABLE instances ADD COLUMN system_metadata JSONB NOT NULL DEFAULT '{}';
