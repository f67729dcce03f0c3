-- An evacuation asked for at compute microversion 2.95 or later ends with the server
-- stopped on its new host, whether it ran before or not; earlier ones keep its state.
ALTER TABLE migrations ADD COLUMN end_stopped BOOLEAN NOT NULL DEFAULT false;
