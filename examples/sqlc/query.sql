-- name: CreateOrder :one
INSERT INTO orders (id, customer_email, sku, amount_cents, currency)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO NOTHING
RETURNING id, customer_email, sku, amount_cents, currency, created_at;

-- name: GetOrder :one
SELECT id, customer_email, sku, amount_cents, currency, created_at
FROM orders WHERE id = $1;

-- name: ReserveStock :exec
UPDATE stock SET quantity = quantity - 1 WHERE sku = $1;

-- name: CountOrders :one
SELECT count(*) FROM orders;
