-- The shipping service's projection of the bookstore's orders.
CREATE TABLE shipping_orders (
    order_id     text        PRIMARY KEY,
    status       text        NOT NULL CHECK (status IN ('placed', 'cancelled')),
    customer_id  text        NOT NULL,
    currency     text        NOT NULL,
    total        text        NOT NULL,
    placed_at    timestamptz,
    cancelled_at timestamptz,
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Every event the projection applied, in the order it applied them: the
-- shipment history, and what the tests check for exactly-once, in-order
-- handling.
CREATE TABLE shipping_events (
    n          bigserial   PRIMARY KEY,
    order_id   text        NOT NULL,
    key_seq    bigint      NOT NULL,
    type       text        NOT NULL,
    message_id text        NOT NULL,
    instance   text        NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX shipping_events_order ON shipping_events (order_id, key_seq);
