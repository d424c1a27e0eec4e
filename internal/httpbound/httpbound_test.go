package httpbound

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// readCounter records whether anything read the body.
type readCounter struct {
	io.Reader
	read bool
}

func (r *readCounter) Read(p []byte) (int, error) { r.read = true; return r.Reader.Read(p) }

// A body declared over the limit is refused with 413 unread; one the
// budget cannot hold now, with 503 and Retry-After, unread; a chunked body
// reserves the limit and is cut there; a reservation is given back when
// the handler returns.
func TestBudget_RefusesBeforeReading(t *testing.T) {
	t.Parallel()
	b := NewBudget(100)
	hold := make(chan struct{})
	entered := make(chan struct{})
	h := b.Limit(60, "a test body", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-hold
		}
		if _, err := ReadBody(r, 60); err != nil {
			if TooLarge(err) {
				http.Error(w, "too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, err.Error(), http.StatusBadRequest)
		}
	}))
	serve := func(path string, body string, length int64) (*httptest.ResponseRecorder, *readCounter) {
		rc := &readCounter{Reader: strings.NewReader(body)}
		r := httptest.NewRequest(http.MethodPost, path, rc)
		r.ContentLength = length
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w, rc
	}
	if w, rc := serve("/", strings.Repeat("x", 61), 61); w.Code != http.StatusRequestEntityTooLarge || rc.read {
		t.Fatalf("declared over the limit: %d, read %v", w.Code, rc.read)
	}
	if w, _ := serve("/", strings.Repeat("x", 61), -1); w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked over the limit: %d, want 413", w.Code)
	}
	if w, _ := serve("/", strings.Repeat("x", 60), -1); w.Code != http.StatusOK {
		t.Fatalf("chunked at the limit: %d, want 200", w.Code)
	}
	done := make(chan struct{})
	go func() { defer close(done); serve("/hold", strings.Repeat("x", 50), 50) }()
	<-entered
	if got := b.Used(); got != 50 {
		t.Fatalf("reserved %d while one body of 50 is held, want 50", got)
	}
	if w, rc := serve("/", strings.Repeat("x", 51), 51); w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || rc.read {
		t.Fatalf("past the budget: %d, Retry-After %q, read %v", w.Code, w.Header().Get("Retry-After"), rc.read)
	}
	if w, _ := serve("/", strings.Repeat("x", 50), 50); w.Code != http.StatusOK {
		t.Fatalf("within the budget: %d", w.Code)
	}
	close(hold)
	<-done
	if got := b.Used(); got != 0 {
		t.Fatalf("reserved %d once every handler returned, want 0", got)
	}
	if w, _ := serve("/", "", 0); w.Code != http.StatusOK || b.Used() != 0 {
		t.Fatalf("no body: %d", w.Code)
	}
}
