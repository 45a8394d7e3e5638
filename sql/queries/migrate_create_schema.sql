-- migrate: the schema that holds every workpump object.
CREATE SCHEMA IF NOT EXISTS {schema}
