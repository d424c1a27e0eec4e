package console

import (
	"container/list"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sidefx/sidefx/internal/httpbound"
)

// Failed sign-ins (the form, or a bearer token no line names) are limited
// per client's address block: after failuresBurst failures, one more may be
// tried every minute/failuresPerMinute; until then the client gets 429,
// and its token is not even checked. Tokens are long and random, so this
// only makes guessing slower still, and the logs quieter.
//
// A block is an IPv6 address's /64, an IPv4 address itself. A /64 is the
// smallest network handed to a site (RFC 7421: SLAAC, and providers
// delegate a /64 or more), so a client has a whole one and may write a new
// address from it on every try; an IPv4 address is scarce, and a /24 is
// often many unrelated clients (a carrier's NAT, a campus), whom one
// client's failures would lock out.
//
// Over all blocks, globalFailures failures in a minute (globalWindow) trip
// a ceiling: until that minute has passed, a block that has failed in it
// gets 429 on every sign-in attempt (form or bearer token), and a block
// that has not may still try, its first failure locking it for the rest
// of the minute. A client holding many blocks (an IPv6 /48 has 65,536
// /64s) gets one guess per fresh block a minute past the ceiling, not
// ten; clients that have not failed, and sessions already signed in, are
// never locked out by others' failures.
const (
	failuresPerMinute = 6
	failuresBurst     = 10
	// throttleKeep bounds the blocks remembered: past it, the block that
	// failed least recently is forgotten, in constant time. Forgetting a
	// block takes throttleKeep failures from other blocks; past the
	// ceiling each block fails once a window, so only a client holding
	// thousands of blocks can, and a forgotten block is a fresh one.
	throttleKeep = 10000
	// globalFailures is the ceiling of failed sign-ins, over all clients,
	// in a minute (globalWindow), past which a block's first failure locks
	// it for the rest of the minute.
	globalFailures = 100
	globalWindow   = time.Minute
)

// throttle counts failed sign-ins per address block, in a list of at most
// keep blocks ordered by their last failure, and over all blocks per
// window.
type throttle struct {
	mu   sync.Mutex
	by   map[string]*list.Element // block → its element in lru
	lru  *list.List               // *blockFailures, the most recent failure first
	keep int
	now  func() time.Time

	ceiling  int       // failures in a window past which a block that failed in it waits
	windowAt time.Time // start of the current window
	failures int       // failures counted in it
}

type blockFailures struct {
	block string
	l     *rate.Limiter
	last  time.Time // its last failure
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{by: map[string]*list.Element{}, lru: list.New(), keep: throttleKeep, ceiling: globalFailures, now: now}
}

// addrBlock is the block addr counts for (httpbound.Block).
func addrBlock(addr string) string { return httpbound.Block(addr) }

// blocked reports whether addr may not try to sign in now, how long until
// it may, and whether that is because of the global ceiling.
func (t *throttle) blocked(addr string) (blocked bool, wait time.Duration, global bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	e, ok := t.by[addrBlock(addr)]
	if !ok {
		return false, 0, false
	}
	bf := e.Value.(*blockFailures)
	if end := t.windowAt.Add(globalWindow); t.failures >= t.ceiling && now.Before(end) && !bf.last.Before(t.windowAt) {
		return true, end.Sub(now), true
	}
	l := bf.l
	if tokens := l.TokensAt(now); tokens < 1 {
		return true, time.Duration((1 - tokens) / float64(l.Limit()) * float64(time.Second)), false
	}
	return false, 0, false
}

// failed counts a failure of addr.
func (t *throttle) failed(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if !now.Before(t.windowAt.Add(globalWindow)) {
		t.windowAt, t.failures = now, 0
	}
	t.failures++
	block := addrBlock(addr)
	e, ok := t.by[block]
	if ok {
		t.lru.MoveToFront(e)
	} else {
		if t.lru.Len() >= t.keep {
			last := t.lru.Back()
			t.lru.Remove(last)
			delete(t.by, last.Value.(*blockFailures).block)
		}
		e = t.lru.PushFront(&blockFailures{block: block, l: rate.NewLimiter(rate.Limit(failuresPerMinute)/60, failuresBurst)})
		t.by[block] = e
	}
	bf := e.Value.(*blockFailures)
	bf.l.AllowN(now, 1)
	bf.last = now
}

// clientAddr is who a request comes from: its peer's address, or, when
// the peer is a trusted proxy, the rightmost X-Forwarded-For entry that is
// not itself a trusted proxy, walking from the right. The entries to the
// left of that one are written by the client, so keying on them would let
// a client evade the limit by varying them; keying on the proxy would let
// one client's failures lock out everyone behind it. An entry that is not
// an address, or a header of trusted proxies only, keys on the peer.
func (h *Handler) clientAddr(r *http.Request) string {
	peer, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		peer = r.RemoteAddr
	}
	a := &h.cfg.Auth
	if !a.trusted(r) {
		return peer
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop := strings.TrimSpace(hops[i])
		if hop == "" {
			continue
		}
		addr, err := netip.ParseAddr(hop)
		if err != nil {
			ap, err := netip.ParseAddrPort(hop)
			if err != nil {
				return peer
			}
			addr = ap.Addr()
		}
		if !a.trustedAddr(addr) {
			return addr.Unmap().String()
		}
	}
	return peer
}

// throttled answers 429 when r's client has failed too often, and reports
// whether it did.
func (h *Handler) throttled(w http.ResponseWriter, r *http.Request) bool {
	blocked, wait, global := h.fails.blocked(h.clientAddr(r))
	if !blocked {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(wait.Seconds()+0.999))))
	if global {
		h.log.Warn("console: sign-in refused: too many failed sign-ins on this console in the last minute, one from this address", "remote", h.clientAddr(r))
		h.refuse(w, r, nil, http.StatusTooManyRequests, "too many failed sign-ins on this console, one of them from this address: try again later")
		return true
	}
	h.log.Warn("console: sign-in refused: too many failures from this address", "remote", h.clientAddr(r))
	h.refuse(w, r, nil, http.StatusTooManyRequests, "too many failed sign-ins from this address: try again later")
	return true
}
