-- Shared by every variant of pieces.sh: a time-ordered UUID (PostgreSQL 15
-- has no uuidv7), the same cost in every variant.
CREATE FUNCTION uuid7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT (lpad(to_hex(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0')
            || '7' || substr(md5(random()::text), 1, 19))::uuid
$$;
