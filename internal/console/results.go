package console

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"time"
)

// results keeps the outcome of each bulk action for a while, so that the
// POST answers with a redirect to a page showing it (post-redirect-get): a
// reload of that page shows the outcome again instead of sending the
// action again. Each outcome is shown only to the actor who made it; at
// most resultsKept are kept, each for resultsFor.
type results struct {
	mu   sync.Mutex
	byID map[string]result
	now  func() time.Time
}

type result struct {
	actor string
	at    time.Time
	title string
	data  doneData
}

const (
	resultsKept = 1000
	resultsFor  = 30 * time.Minute
)

// put keeps d for actor and returns its id.
func (rs *results) put(actor, title string, d doneData) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.byID == nil {
		rs.byID = map[string]result{}
	}
	now := rs.now()
	for k, r := range rs.byID {
		if now.Sub(r.at) > resultsFor {
			delete(rs.byID, k)
		}
	}
	for len(rs.byID) >= resultsKept { // the oldest go first
		oldest := ""
		for k, r := range rs.byID {
			if oldest == "" || r.at.Before(rs.byID[oldest].at) {
				oldest = k
			}
		}
		delete(rs.byID, oldest)
	}
	rs.byID[id] = result{actor: actor, at: now, title: title, data: d}
	return id
}

// get returns the outcome id holds for actor.
func (rs *results) get(actor, id string) (result, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.byID[id]
	if !ok || r.actor != actor || rs.now().Sub(r.at) > resultsFor {
		return result{}, false
	}
	return r, true
}

// bulkDone shows a bulk action's outcome, kept by bulk.
func (h *Handler) bulkDone(w http.ResponseWriter, r *http.Request, id *identity) {
	res, ok := h.results.get(id.Actor, r.PathValue("id"))
	if !ok {
		h.refuse(w, r, id, http.StatusNotFound, "this outcome is no longer kept (or is another user's): the effects' history has what was done")
		return
	}
	p := h.newPage(res.title, id)
	p.D = res.data
	h.render(w, r, http.StatusOK, "done", p)
}
