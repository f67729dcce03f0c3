-- A server's host name (microversion 2.90): the one asked for at create or update time,
-- else made from its name when it was created. NULL on servers created before this
-- column: their host name is still made from their name, as it was.
ALTER TABLE instances ADD COLUMN hostname TEXT;
