-- Claims are held by a consumer on a compute node. The consumer is the instance itself,
-- or, during a move, the migration, so that a move can hold the source and the
-- destination at once. instance_uuid says which instance a claim serves either way.
ALTER TABLE allocations RENAME COLUMN instance_uuid TO consumer_uuid;
ALTER TABLE allocations RENAME CONSTRAINT allocations_instance_uuid_compute_node_id_key
    TO allocations_consumer_node_key;
ALTER TABLE allocations ADD COLUMN instance_uuid UUID;
UPDATE allocations SET instance_uuid = consumer_uuid;
ALTER TABLE allocations ALTER COLUMN instance_uuid SET NOT NULL;
CREATE INDEX allocations_instance ON allocations (instance_uuid);
CREATE INDEX allocations_node ON allocations (compute_node_id);

-- The conductor's build deadline looks for instances still building.
CREATE INDEX instances_building ON instances (created_at)
    WHERE vm_state = 'building' AND deleted_at IS NULL;
