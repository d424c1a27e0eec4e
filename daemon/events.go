package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/httpbound"
	"github.com/sidefx/sidefx/internal/metrics"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/reconcile"
)

// maxEventBody bounds a delivery of events: a longer one is refused (413)
// before a byte of it is read when it declares its length, and cut there
// when it does not. The providers' own maxima:
//
//   - SendGrid posts its Event Webhook's batches "every 30 seconds or when
//     the batch size reaches 768 kilobytes, whichever occurs first"
//     (Twilio SendGrid, "Getting Started with the Event Webhook",
//     https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/getting-started-event-webhook);
//     a batch closes past that size, so 1 MiB leaves room for its last
//     event.
//   - Stripe documents no maximum for an event: it posts one event, whose
//     data holds one object, with its lists cut to their first page and
//     metadata limited to 50 keys of 40 characters with values of 500
//     (https://docs.stripe.com/metadata, "Metadata limits"); such events
//     are a few kilobytes to a few tens of kilobytes, and 1 MiB is a
//     conservative bound far above them.
const maxEventBody = 1 << 20

// eventsBudget bounds the bytes of event deliveries held in memory at
// once, across providers: 16 whole deliveries; one client (an IPv4
// address, an IPv6 /64) holds at most a quarter of it. The bytes are
// reserved as they arrive, and a delivery must keep httpbound's pace (2 s
// for its first bytes, 128 KiB a second after): one client cannot make
// another's delivery wait or be refused. A delivery past it is refused
// with 503 and Retry-After; Stripe and SendGrid both deliver again later
// (for days, and for 24 hours).
const eventsBudget = 16 << 20

// newEventsBudget is the budget of the events endpoint.
func newEventsBudget() *httpbound.Budget {
	return httpbound.NewBudget(httpbound.BudgetConfig{Total: eventsBudget})
}

// eventsHandler takes the providers' signed event deliveries at POST
// /events/{provider}: verified by the provider's EventSource (401 when they
// do not verify), each event that names a sidefx key stored once as
// evidence for reconciliation (503 when the database fails, so that the
// provider delivers again). Events without a sidefx key are not sidefx's,
// and are counted and dropped. Before a byte of the body is read, a
// provider without an event source is refused (404), and a delivery
// declaring more than maxEventBody (413); one that budget cannot hold, or
// that falls behind httpbound's pace, is refused as it is read (503 with
// Retry-After, 408).
func eventsHandler(db engine.DB, schema string, sources map[string]providers.EventSource, budget *httpbound.Budget, count func(provider, result string, n int), log *slog.Logger) http.HandlerFunc {
	stores := []eventStore{{db: db, schema: schema, count: count}}
	return eventsHandlerTo(func(string) []eventStore { return stores }, sources, budget, log)
}

// eventStore is a database a provider's events are stored in, and the
// counter of its metrics.
type eventStore struct {
	name   string // the database's
	db     engine.DB
	schema string
	count  func(provider, result string, n int)
}

// eventStores are, by provider, the databases serving a kind of the
// provider: of several databases, a provider's events are stored in each
// (the effect a key names is in one of them; the evidence elsewhere names
// no effect, and goes with the retention of reconciliation's evidence).
func eventStores(dbs []*database) func(provider string) []eventStore {
	by := map[string][]eventStore{}
	for _, db := range dbs {
		for name := range db.rt.EventSources {
			by[name] = append(by[name], eventStore{name: db.name, db: db.pool, schema: db.rt.Dispatcher.Schema, count: db.m.Event})
		}
	}
	return func(provider string) []eventStore { return by[provider] }
}

// eventsHandlerTo is eventsHandler storing each provider's events in the
// databases stores names.
func eventsHandlerTo(stores func(provider string) []eventStore, sources map[string]providers.EventSource, budget *httpbound.Budget, log *slog.Logger) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("provider")
		src, ok := sources[name]
		if !ok {
			w.Header().Set("Connection", "close")
			http.Error(w, "no event endpoint for provider "+strconv.Quote(name)+" (event_public_key for sendgrid, webhook_secret_env for stripe)", http.StatusNotFound)
			return
		}
		budget.Limit(maxEventBody, "an event delivery", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			events(w, r, name, src, stores(name), log)
		})).ServeHTTP(w, r)
	}
}

// events reads, verifies and stores one delivery of name's events.
func events(w http.ResponseWriter, r *http.Request, name string, src providers.EventSource, stores []eventStore, log *slog.Logger) {
	body, err := httpbound.Body(r, maxEventBody)
	if err != nil { // read whole by budget.Limit, which answered any failure
		http.Error(w, "the delivery could not be read: "+err.Error(), http.StatusBadRequest)
		return
	}
	evs, err := src.Events(r.Header, body)
	if errors.Is(err, providers.ErrBadSignature) {
		for _, st := range stores {
			st.count(name, metrics.EventRefused, 1)
		}
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
	failed := false
	for _, st := range stores {
		added := 0
		ours = 0
		for _, e := range evs {
			if e.Key == "" {
				continue
			}
			ours++
			ok, err := reconcile.Record(r.Context(), st.db, st.schema, 0, e.Key, name, "event", e.ID, e.Evidence)
			if err != nil {
				// The other databases still get the events now; the
				// delivery again (the 503 below) is absorbed where stored.
				log.Error("storing provider events failed", "provider", name, "database", st.name, "err", err)
				failed = true
				break
			}
			if ok {
				added++
			}
		}
		st.count(name, metrics.EventStored, added)
		st.count(name, metrics.EventDuplicate, ours-added)
		st.count(name, metrics.EventForeign, len(evs)-ours)
		stored = max(stored, added)
	}
	if failed {
		http.Error(w, "the events could not be stored; deliver them again", http.StatusServiceUnavailable)
		return
	}
	log.Debug("provider events", "provider", name, "events", len(evs), "sidefx", ours, "stored", stored)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"events":%d,"sidefx":%d,"stored":%d}`+"\n", len(evs), ours, stored)
}
