// Package httpbound bounds what the daemon's HTTP servers hold for their
// clients: the bytes of request bodies in memory at once, over all clients
// and per client, each body's size and pace, and the server's timeouts and
// header size. Every surface the daemon serves (metrics and health,
// provider events, the console) goes through it, so that no client, signed
// in or not, grows the process without bound or shuts other clients out.
package httpbound

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
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

// The pace a body must keep: its bytes arrive within BodyGrace plus one
// second per MinBodyRate bytes received, counted from the end of its
// headers; a body behind that pace is cut with 408. A declared body that
// sends nothing is cut after BodyGrace. At this pace a body of 1 MiB is
// read within 10 s, inside the servers' read timeouts (15 s and 30 s).
const (
	BodyGrace   = 2 * time.Second
	MinBodyRate = 128 << 10 // bytes a second
)

// Block is the address block addr counts for, as one client: an IPv6
// address's /64, an IPv4 address (IPv4-mapped IPv6 included) itself;
// anything that does not parse as an address counts as itself.
//
// A /64 is the smallest network handed to a site (RFC 7421: SLAAC, and
// providers delegate a /64 or more), so a client has a whole one and may
// use a new address from it for every request; an IPv4 address is scarce,
// and a /24 is often many unrelated clients (a carrier's NAT, a campus).
func Block(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	return netip.PrefixFrom(a, 64).Masked().String()
}

// PeerBlock is the Block of r's peer (RemoteAddr).
func PeerBlock(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return Block(host)
}

// BudgetConfig configures a Budget.
type BudgetConfig struct {
	// Total bounds the bytes of bodies held at once over all clients.
	Total int64
	// PerClient bounds the bytes of bodies one client holds at once.
	// Default (0): Total/4.
	PerClient int64
	// Client names the client a request counts for. Default (nil):
	// PeerBlock.
	Client func(*http.Request) string
	// Grace and Rate set the pace a body must keep (see BodyGrace).
	// Defaults (0): BodyGrace and MinBodyRate.
	Grace time.Duration
	Rate  int64
}

// Budget bounds the bytes of request bodies held in memory at once, over
// all the requests it guards and per client. A request reserves its body's
// bytes as they arrive: its buffer grows as it fills (doubling, from
// 4 KiB, never past the declared length), and each growth is reserved
// before it is made; the reservation is given back when the handler
// returns. A growth past the client's share or past the total is refused
// with 503 and Retry-After at once, rather than queued. So a client holds
// only what it has sent (at most twice that, rounded up to 4 KiB), only at
// the pace BodyGrace and MinBodyRate require, and never more than its
// share: it cannot make another client's request wait or be refused.
type Budget struct {
	total, share int64
	client       func(*http.Request) string
	grace        time.Duration
	rate         int64

	mu   sync.Mutex
	used int64
	by   map[string]int64 // client → bytes it holds; no zero entries
}

// NewBudget returns a budget as cfg says.
func NewBudget(cfg BudgetConfig) *Budget {
	b := &Budget{total: cfg.Total, share: cfg.PerClient, client: cfg.Client, grace: cfg.Grace, rate: cfg.Rate, by: map[string]int64{}}
	if b.share <= 0 {
		b.share = b.total / 4
	}
	if b.client == nil {
		b.client = PeerBlock
	}
	if b.grace <= 0 {
		b.grace = BodyGrace
	}
	if b.rate <= 0 {
		b.rate = MinBodyRate
	}
	return b
}

// RetryAfter is the Retry-After, in seconds, of a request refused because
// the budget is spent.
const RetryAfter = 5

func (b *Budget) take(client string, n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+n > b.total || b.by[client]+n > b.share {
		return false
	}
	b.used += n
	b.by[client] += n
	return true
}

func (b *Budget) give(client string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.by[client] -= n; b.by[client] == 0 {
		delete(b.by, client)
	}
}

// Used reports the bytes reserved now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// errBusy is a body refused because the budget cannot hold more of it.
var errBusy = errors.New("the budget is spent")

// firstGrowth is the buffer a body starts with, reserved before its first
// byte arrives.
const firstGrowth = 4 << 10

// Limit wraps h: a request whose declared body is longer than max is
// refused with 413 before a byte of it is read; any other body is read
// whole before h is called, its bytes reserved as they arrive (see
// Budget), and h reads it from memory, with Body. Reading it ends with 413
// past max (a chunked body), 503 and Retry-After when the budget cannot
// hold more of it, 408 when it falls behind its pace, 400 when it ends
// early; each closes the connection. A request without a body reserves
// nothing. what names the body in the refusals ("an event delivery").
func (b *Budget) Limit(max int64, what string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > max {
			w.Header().Set("Connection", "close")
			http.Error(w, fmt.Sprintf("%s is at most %d bytes; this one declares %d", what, max, r.ContentLength), http.StatusRequestEntityTooLarge)
			return
		}
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		client := b.client(r)
		body, held, err := b.read(w, r, client, max)
		defer b.give(client, held)
		if err != nil {
			w.Header().Set("Connection", "close")
			var ne net.Error
			switch {
			case errors.Is(err, errBusy):
				w.Header().Set("Retry-After", strconv.Itoa(RetryAfter))
				http.Error(w, "too many requests are being read now: try again later", http.StatusServiceUnavailable)
			case TooLarge(err):
				http.Error(w, fmt.Sprintf("%s is at most %d bytes", what, max), http.StatusRequestEntityTooLarge)
			case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
				http.Error(w, fmt.Sprintf("%s arrived too slowly: its bytes must arrive within %s plus a second per %d KiB", what, b.grace, b.rate>>10), http.StatusRequestTimeout)
			default:
				http.Error(w, what+" could not be read: "+err.Error(), http.StatusBadRequest)
			}
			return
		}
		r.Body = &buffered{Reader: bytes.NewReader(body), b: body}
		h.ServeHTTP(w, r)
	})
}

// read reads r's body, at most max bytes, into a buffer that grows as it
// fills, reserving each growth for client; it returns the body and the
// bytes reserved, which the caller gives back.
func (b *Budget) read(w http.ResponseWriter, r *http.Request, client string, most int64) (body []byte, held int64, err error) {
	limit := most + 1 // a chunked body: one byte past max tells it is longer
	if r.ContentLength > 0 {
		limit = r.ContentLength
	}
	rc := http.NewResponseController(w)
	start := time.Now()
	// The server's own deadline is cleared once the body is read: h's
	// answer must not be cut by the pace, and net/http sets the next
	// request's deadline itself.
	defer rc.SetReadDeadline(time.Time{}) //nolint:errcheck // a writer without deadlines has no pace either
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			if int64(len(buf)) >= limit {
				break
			}
			grow := min(max(int64(cap(buf)), firstGrowth), limit-int64(cap(buf)))
			if !b.take(client, grow) {
				return nil, held, errBusy
			}
			held += grow
			next := make([]byte, len(buf), int64(cap(buf))+grow)
			copy(next, buf)
			buf = next
		}
		_ = rc.SetReadDeadline(start.Add(b.grace + time.Duration(float64(len(buf))/float64(b.rate)*float64(time.Second))))
		n, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, held, err
		}
	}
	switch {
	case int64(len(buf)) > most:
		return nil, held, &http.MaxBytesError{Limit: most}
	case r.ContentLength > 0 && int64(len(buf)) < r.ContentLength:
		return nil, held, fmt.Errorf("the body ended after %d of its %d bytes", len(buf), r.ContentLength)
	}
	return buf, held, nil
}

// buffered is a body Limit read whole.
type buffered struct {
	io.Reader
	b []byte
}

func (*buffered) Close() error { return nil }

// Body returns the body of a request Limit read, without copying it; for
// any other request, it reads the body, at most max bytes (an error
// wrapping *http.MaxBytesError past that, reported by TooLarge).
func Body(r *http.Request, max int64) ([]byte, error) {
	if bb, ok := r.Body.(*buffered); ok {
		return bb.b, nil
	}
	return io.ReadAll(http.MaxBytesReader(nil, r.Body, max))
}

// TooLarge reports whether err is a body cut at its limit.
func TooLarge(err error) bool {
	var mb *http.MaxBytesError
	return errors.As(err, &mb)
}
