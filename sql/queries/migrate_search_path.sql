-- migrate: the migrations create their objects unqualified, in this schema; pg_temp comes last,
-- so that functions created with SET search_path FROM CURRENT never see a caller's temporary
-- tables (left out, pg_temp would be searched first).
SET search_path TO {schema}, pg_temp
