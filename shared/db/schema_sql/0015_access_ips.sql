-- The addresses a server's owner says it is reached at (accessIPv4 / accessIPv6), kept
-- as given (validated and normalised by keel-api) and shown in servers. NULL: none.

ALTER TABLE instances
    ADD COLUMN access_ip_v4 TEXT,
    ADD COLUMN access_ip_v6 TEXT;
