// source: query.sql

package main

import (
	"context"
)

const countOrders = `-- name: CountOrders :one
SELECT count(*) FROM orders
`

func (q *Queries) CountOrders(ctx context.Context) (int64, error) {
	row := q.db.QueryRowContext(ctx, countOrders)
	var count int64
	err := row.Scan(&count)
	return count, err
}

const createOrder = `-- name: CreateOrder :one
INSERT INTO orders (id, customer_email, sku, amount_cents, currency)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO NOTHING
RETURNING id, customer_email, sku, amount_cents, currency, created_at
`

type CreateOrderParams struct {
	ID            string
	CustomerEmail string
	Sku           string
	AmountCents   int64
	Currency      string
}

func (q *Queries) CreateOrder(ctx context.Context, arg CreateOrderParams) (Order, error) {
	row := q.db.QueryRowContext(ctx, createOrder,
		arg.ID,
		arg.CustomerEmail,
		arg.Sku,
		arg.AmountCents,
		arg.Currency,
	)
	var i Order
	err := row.Scan(
		&i.ID,
		&i.CustomerEmail,
		&i.Sku,
		&i.AmountCents,
		&i.Currency,
		&i.CreatedAt,
	)
	return i, err
}

const getOrder = `-- name: GetOrder :one
SELECT id, customer_email, sku, amount_cents, currency, created_at
FROM orders WHERE id = $1
`

func (q *Queries) GetOrder(ctx context.Context, id string) (Order, error) {
	row := q.db.QueryRowContext(ctx, getOrder, id)
	var i Order
	err := row.Scan(
		&i.ID,
		&i.CustomerEmail,
		&i.Sku,
		&i.AmountCents,
		&i.Currency,
		&i.CreatedAt,
	)
	return i, err
}

const reserveStock = `-- name: ReserveStock :exec
UPDATE stock SET quantity = quantity - 1 WHERE sku = $1
`

func (q *Queries) ReserveStock(ctx context.Context, sku string) error {
	_, err := q.db.ExecContext(ctx, reserveStock, sku)
	return err
}
