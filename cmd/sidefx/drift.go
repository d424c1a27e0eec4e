package main

import (
	"context"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/internal/config"
)

// startDrift starts the drift schedule; the returned function stops it.
// The scheduler, its stored findings and metrics come with the drift work.
func startDrift(ctx context.Context, pool *pgxpool.Pool, store *effects.Store, rt *config.Runtime, reg prometheus.Registerer, log *slog.Logger) func() {
	return func() {}
}

func driftCmd(ctx context.Context, io *IO, args []string) error {
	return usageErr("drift: not built yet")
}
