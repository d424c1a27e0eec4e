-- The service's own tables (sqlc reads them to type the queries). The
-- sidefx schema (side_effects and its functions) comes from sidefx's
-- migrations: `sidefx migrate`, or migrations.Apply as main.go does.
CREATE TABLE IF NOT EXISTS orders (
  id             text        PRIMARY KEY,
  customer_email text        NOT NULL,
  sku            text        NOT NULL,
  amount_cents   bigint      NOT NULL,
  currency       text        NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS stock (
  sku      text    PRIMARY KEY,
  quantity integer NOT NULL CHECK (quantity >= 0)
);

INSERT INTO stock (sku, quantity) VALUES ('mug', 1) ON CONFLICT (sku) DO NOTHING;
