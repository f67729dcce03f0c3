-- A server's config drive: the user asked for one at create time (--config-drive true).
-- The libvirt driver gives the guest an ISO 9660 disk labelled config-2 with what the
-- metadata service also answers; an agent may be told to give every guest one.
ALTER TABLE instances ADD COLUMN config_drive BOOLEAN NOT NULL DEFAULT false;
