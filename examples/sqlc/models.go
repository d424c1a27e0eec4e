package main

import (
	"time"
)

type Order struct {
	ID            string
	CustomerEmail string
	Sku           string
	AmountCents   int64
	Currency      string
	CreatedAt     time.Time
}

type Stock struct {
	Sku      string
	Quantity int32
}
