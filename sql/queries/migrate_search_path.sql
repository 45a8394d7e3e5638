-- migrate: the migrations create their objects unqualified, in this schema.
SET search_path TO {schema}
