-- One record of the current copy: every copy of a server carries the token of the build
-- or move that made it (the guest's origin), and the server row says which token is its
-- current copy's. Every decision to adopt, keep or remove a guest, and every late build
-- result, compares tokens.
--
-- copy_token: the token of the server's current copy: its build's (new for every server)
-- until a move arrives, then that move's (the migration's uuid), back to the one before
-- if a cold migration is reverted. NULL on rows an older release wrote and never moved:
-- their copy carries no token either (it was built before tokens).
ALTER TABLE instances ADD COLUMN copy_token UUID;
UPDATE instances i SET copy_token = m.uuid
  FROM (SELECT DISTINCT ON (instance_uuid) instance_uuid, uuid FROM migrations
         WHERE status IN ('done', 'completed', 'finished', 'confirming', 'confirmed')
           AND deleted_at IS NULL
           AND source_compute_id IS DISTINCT FROM dest_compute_id
         ORDER BY instance_uuid, id DESC) m
 WHERE m.instance_uuid = i.uuid;
ALTER TABLE instances ALTER COLUMN copy_token SET DEFAULT gen_random_uuid();

-- source_token: the token of the copy a move starts from (the server's when the move was
-- recorded): what a revert makes current again.
ALTER TABLE migrations ADD COLUMN source_token UUID;
