-- Images with data: the hashes computed on upload, and the upload in progress. An
-- upload owns its image (status 'saving') by its random token, and keeps updated_at
-- fresh while it streams; an upload silent for minutes may be taken over by another.
ALTER TABLE images
    ADD COLUMN checksum      TEXT,
    ADD COLUMN os_hash_algo  TEXT,
    ADD COLUMN os_hash_value TEXT,
    ADD COLUMN upload_token  UUID;
