// Package httpbound bounds what the daemon's HTTP servers hold for their
// clients: the bytes of request bodies in memory at once, each body's size,
// and the server's timeouts and header size. Every surface the daemon
// serves (metrics and health, provider events, the console) goes through
// it, so that no client, signed in or not, grows the process without
// bound.
package httpbound

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Server timeouts and the header limit of every server the daemon runs.
const (
	// ReadHeaderTimeout bounds the time to read a request's headers.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout bounds how long a kept-alive connection waits for its
	// next request.
	IdleTimeout = 2 * time.Minute
	// MaxHeaderBytes bounds a request's headers (net/http's default is
	// 1 MiB): the providers' signatures, a session cookie and a bearer
	// token take a few hundred bytes.
	MaxHeaderBytes = 64 << 10
)

// Server returns a server for h with the limits above, a whole request
// (headers and body) read within read, and an answer written within write.
func Server(h http.Handler, read, write time.Duration) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: min(ReadHeaderTimeout, read), ReadTimeout: read,
		WriteTimeout: write, IdleTimeout: IdleTimeout, MaxHeaderBytes: MaxHeaderBytes}
}

// Budget bounds the bytes of request bodies held in memory at once, across
// every request it guards. A request reserves its body's declared length
// (Content-Length), or the most its handler reads when it declares none
// (chunked), before a byte of the body is read, and gives it back when its
// handler returns. A request that would take the budget past its total is
// refused with 503 and Retry-After at once, without reading its body,
// rather than queued: a client that sends slowly holds its share only for
// the server's read timeout.
type Budget struct {
	total int64

	mu   sync.Mutex
	used int64
}

// NewBudget returns a budget of total bytes.
func NewBudget(total int64) *Budget { return &Budget{total: total} }

// RetryAfter is the Retry-After, in seconds, of a request refused because
// the budget is spent.
const RetryAfter = 5

func (b *Budget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.total {
		return false
	}
	b.used += n
	return true
}

func (b *Budget) give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// Used reports the bytes reserved now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Limit wraps h: a request whose declared body is longer than max is
// refused with 413 before a byte of it is read; one the budget cannot hold
// now, with 503 and Retry-After; any other has its body cut at max (a
// longer chunked body makes h's read fail with *http.MaxBytesError) and
// its reservation held until h returns. A request without a body reserves
// nothing. what names the body in the refusals ("an event delivery").
func (b *Budget) Limit(max int64, what string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.ContentLength
		switch {
		case n > max:
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("%s is at most %d bytes; this one declares %d", what, max, n), http.StatusRequestEntityTooLarge)
			return
		case n < 0: // chunked: as much as h may read
			n = max
		}
		if n > 0 {
			if !b.take(n) {
				w.Header().Set("Retry-After", strconv.Itoa(RetryAfter))
				w.Header().Set("Connection", "close")
				http.Error(w, "too many requests are being read now: try again later", http.StatusServiceUnavailable)
				return
			}
			defer b.give(n)
		}
		r.Body = http.MaxBytesReader(w, r.Body, max)
		h.ServeHTTP(w, r)
	})
}

// ReadBody reads r's body, at most max bytes, into a buffer sized once
// from its declared length (io.ReadAll's doubling would hold up to twice
// the reservation). A body longer than max is an error wrapping
// *http.MaxBytesError, reported by TooLarge.
func ReadBody(r *http.Request, max int64) ([]byte, error) {
	body := http.MaxBytesReader(nil, r.Body, max)
	if r.ContentLength <= 0 {
		return io.ReadAll(body)
	}
	buf := make([]byte, min(r.ContentLength, max))
	n, err := io.ReadFull(body, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return nil, fmt.Errorf("the body ended after %d of its %d bytes", n, r.ContentLength)
	}
	if err != nil {
		return nil, err
	}
	return buf, nil
}

// TooLarge reports whether err is a body cut at its limit.
func TooLarge(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}
