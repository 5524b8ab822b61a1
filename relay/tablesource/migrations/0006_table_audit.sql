-- Every operator action on the rows taken in (package admin's
-- NewTableStore: list, retry, skip): who, from where, what, on what, and
-- how it ended. The same table as Ordo's own outbox has, which such a
-- database does not otherwise get; one that had the outbox keeps it.
CREATE TABLE IF NOT EXISTS ordo_operator_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    operator    text        NOT NULL,
    remote_addr text        NOT NULL,
    action      text        NOT NULL,
    target      text        NOT NULL,
    result      text        NOT NULL
);
