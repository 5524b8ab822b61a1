-- Every operator action on a consumer's keys (resolve, retry, skip), from
-- the CLI or the HTTP admin API, with who asked, from where, and what came
-- of it: a refused action (nothing to resolve, a database error) is
-- recorded too.
CREATE TABLE ordo_inbox_audit (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    consumer    text        NOT NULL,
    operator    text        NOT NULL,
    remote_addr text        NOT NULL,
    action      text        NOT NULL,
    key         text        NOT NULL,
    result      text        NOT NULL
);
CREATE INDEX ordo_inbox_audit_by_consumer ON ordo_inbox_audit (consumer, id);
