-- How each recorded action ended, as the compute API's instance actions show it:
-- 'Success' or 'Error'; NULL while it runs. A message may explain either.
ALTER TABLE instance_actions ADD COLUMN result TEXT;
UPDATE instance_actions SET result = CASE WHEN message IS NULL THEN 'Success' ELSE 'Error' END
 WHERE finish_time IS NOT NULL;
CREATE INDEX instance_actions_instance_time ON instance_actions (instance_uuid, start_time);
