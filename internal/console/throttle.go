package console

import (
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Failed sign-ins (the form, or a bearer token no line names) are limited
// per client address: after failuresBurst failures, one more may be tried
// every minute/failuresPerMinute; until then the client gets 429, and its
// token is not even checked. Tokens are long and random, so this only
// makes guessing slower still, and the logs quieter.
const (
	failuresPerMinute = 6
	failuresBurst     = 10
	// throttleKeep bounds the addresses remembered: past it, those whose
	// allowance is whole again are forgotten.
	throttleKeep = 10000
)

type throttle struct {
	mu  sync.Mutex
	by  map[string]*rate.Limiter
	now func() time.Time
}

func newThrottle(now func() time.Time) *throttle {
	return &throttle{by: map[string]*rate.Limiter{}, now: now}
}

func (t *throttle) limiter(addr string) *rate.Limiter {
	l := t.by[addr]
	if l == nil {
		if len(t.by) >= throttleKeep {
			now := t.now()
			for a, x := range t.by {
				if x.TokensAt(now) >= failuresBurst {
					delete(t.by, a)
				}
			}
		}
		l = rate.NewLimiter(rate.Limit(failuresPerMinute)/60, failuresBurst)
		t.by[addr] = l
	}
	return l
}

// blocked reports whether addr has used its allowance of failures, and
// how long until it may try again.
func (t *throttle) blocked(addr string) (bool, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	l, ok := t.by[addr]
	if !ok {
		return false, 0
	}
	now := t.now()
	if tokens := l.TokensAt(now); tokens < 1 {
		return true, time.Duration((1 - tokens) / float64(l.Limit()) * float64(time.Second))
	}
	return false, 0
}

// failed counts a failure of addr.
func (t *throttle) failed(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.limiter(addr).AllowN(t.now(), 1)
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
	blocked, wait := h.fails.blocked(h.clientAddr(r))
	if !blocked {
		return false
	}
	w.Header().Set("Retry-After", strconv.Itoa(max(1, int(wait.Seconds()+0.999))))
	h.log.Warn("console: sign-in refused: too many failures from this address", "remote", h.clientAddr(r))
	h.refuse(w, r, nil, http.StatusTooManyRequests, "too many failed sign-ins from this address: try again later")
	return true
}
