-- Idempotency keys of POST /orders (the Idempotency-Key header). A key is
-- claimed in the transaction that writes its order, so a retry finds
-- either nothing (the first attempt rolled back) or the committed order,
-- never a second one. request_hash is the SHA-256 of the validated order
-- (customer, currency, items); a key whose created_at is older than the
-- configured TTL may be taken over by a new order and is deleted by the
-- API's cleanup loop.
CREATE TABLE order_idempotency_keys (
    key          text        PRIMARY KEY,
    request_hash bytea       NOT NULL,
    -- Checked at commit: the key row is written before its order.
    order_id     uuid        NOT NULL REFERENCES orders (id) DEFERRABLE INITIALLY DEFERRED,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT order_idempotency_keys_key_format CHECK (key ~ '^[!-~]{1,255}$')
);

-- Expired keys, oldest first, for the cleanup.
CREATE INDEX order_idempotency_keys_created_at ON order_idempotency_keys (created_at);
