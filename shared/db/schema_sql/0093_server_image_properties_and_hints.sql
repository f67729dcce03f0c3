-- What compute microversions 2.98 and 2.100 show of a server: the standard properties
-- of the image it was created from, as they were then, and the scheduler hints its
-- create asked with. Servers created before these columns show none of either.
ALTER TABLE instances ADD COLUMN image_properties JSONB NOT NULL DEFAULT '{}';
ALTER TABLE request_specs ADD COLUMN scheduler_hints JSONB NOT NULL DEFAULT '{}';
