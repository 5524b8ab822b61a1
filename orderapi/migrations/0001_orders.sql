-- Order API tables, version 1. Amounts are exact decimals (numeric) written
-- with the currency's ISO 4217 minor-unit digits, e.g. 25.00 EUR, 1500 JPY.

CREATE TABLE orders (
    id           uuid        PRIMARY KEY,
    customer_id  uuid        NOT NULL,
    currency     text        NOT NULL,
    total        numeric     NOT NULL,
    status       text        NOT NULL DEFAULT 'placed',
    placed_at    timestamptz NOT NULL DEFAULT now(),
    cancelled_at timestamptz,
    CONSTRAINT orders_currency_format CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT orders_total_nonnegative CHECK (total >= 0),
    CONSTRAINT orders_status_known CHECK (status IN ('placed', 'cancelled')),
    CONSTRAINT orders_cancelled_at_iff_cancelled CHECK ((status = 'cancelled') = (cancelled_at IS NOT NULL))
);

CREATE TABLE order_items (
    order_id   uuid    NOT NULL REFERENCES orders (id),
    line       int     NOT NULL,
    book_id    uuid    NOT NULL,
    quantity   int     NOT NULL,
    unit_price numeric NOT NULL,
    PRIMARY KEY (order_id, line),
    CONSTRAINT order_items_line_positive CHECK (line >= 1),
    CONSTRAINT order_items_quantity_range CHECK (quantity BETWEEN 1 AND 10000),
    CONSTRAINT order_items_unit_price_nonnegative CHECK (unit_price >= 0)
);
