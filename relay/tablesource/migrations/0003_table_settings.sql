-- The partition count P the intake hashes keys with, fixed at install as
-- for Ordo's own outbox (whose count is in ordo_settings, which a node
-- relaying an adopted table does not create). A database where a node of
-- an earlier release installed Ordo's outbox beside the adopted table
-- keeps the count installed there.
CREATE TABLE ordo_table_settings (
    single     bool PRIMARY KEY DEFAULT true CHECK (single),
    partitions int  NOT NULL CHECK (partitions > 0)
);

DO $$
BEGIN
    IF to_regclass('ordo_settings') IS NOT NULL THEN
        INSERT INTO ordo_table_settings (partitions) SELECT partitions FROM ordo_settings;
    END IF;
END
$$;
