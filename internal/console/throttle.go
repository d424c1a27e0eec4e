package console

import (
	"net"
	"net/http"
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

// clientAddr is who a request comes from: its peer's address, or, from a
// trusted proxy, the first X-Forwarded-For entry (so that one client's
// failures do not lock out everyone behind the proxy).
func (h *Handler) clientAddr(r *http.Request) string {
	if h.cfg.Auth.trusted(r) {
		if f := strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-For"), ",")[0]); f != "" {
			return f
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
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
