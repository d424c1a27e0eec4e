package daemon

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/metrics"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/reconcile"
)

// maxEventBody bounds a delivery of events (SendGrid batches events into
// deliveries well under it).
const maxEventBody = 8 << 20

// eventsHandler takes the providers' signed event deliveries at POST
// /events/{provider}: verified by the provider's EventSource (401 when they
// do not verify), each event that names a sidefx key stored once as
// evidence for reconciliation (503 when the database fails, so that the
// provider delivers again). Events without a sidefx key are not sidefx's,
// and are counted and dropped.
func eventsHandler(db engine.DB, schema string, sources map[string]providers.EventSource, count func(provider, result string, n int), log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("provider")
		src, ok := sources[name]
		if !ok {
			http.Error(w, "no event endpoint for provider "+strconv.Quote(name)+" (event_public_key for sendgrid, webhook_secret_env for stripe)", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEventBody))
		if err != nil {
			http.Error(w, "the delivery could not be read: "+err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		evs, err := src.Events(r.Header, body)
		if errors.Is(err, providers.ErrBadSignature) {
			count(name, metrics.EventRefused, 1)
			log.Warn("provider events refused: the signature does not verify", "provider", name, "remote", r.RemoteAddr, "err", err)
			http.Error(w, "signature verification failed", http.StatusUnauthorized)
			return
		}
		if err != nil {
			log.Warn("provider events refused", "provider", name, "err", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		stored, ours := 0, 0
		for _, e := range evs {
			if e.Key == "" {
				continue
			}
			ours++
			added, err := reconcile.Record(r.Context(), db, schema, 0, e.Key, name, "event", e.ID, e.Evidence)
			if err != nil {
				log.Error("storing provider events failed", "provider", name, "err", err)
				http.Error(w, "the events could not be stored; deliver them again", http.StatusServiceUnavailable)
				return
			}
			if added {
				stored++
			}
		}
		count(name, metrics.EventStored, stored)
		count(name, metrics.EventDuplicate, ours-stored)
		count(name, metrics.EventForeign, len(evs)-ours)
		log.Debug("provider events", "provider", name, "events", len(evs), "sidefx", ours, "stored", stored)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"events":%d,"sidefx":%d,"stored":%d}`+"\n", len(evs), ours, stored)
	}
}
