-- A server backup's rotation (createBackup): when the image is whole, only the newest
-- this many backups of its server and backup_type are kept. NULL for every other image.
-- Kept here, not among the image's properties, because Nova shows no such property.
ALTER TABLE images ADD COLUMN backup_rotation INTEGER CHECK (backup_rotation >= 0);
