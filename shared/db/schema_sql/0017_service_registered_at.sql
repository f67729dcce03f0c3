-- When a compute agent last registered. It is not up until its first heartbeat (which
-- comes only once its first guest report is answered), yet it is running: an operator
-- rename or delete of its service in that window is refused, as for a service that is up.
ALTER TABLE services ADD COLUMN registered_at TIMESTAMPTZ;
