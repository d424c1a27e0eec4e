package scenario

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"
)

// Mode is what a FaultProxy does with one request.
type Mode int

const (
	// Pass forwards the request and returns the peer's answer.
	Pass Mode = iota
	// LoseAnswer forwards the request, reads the peer's whole answer (the
	// peer has performed it), then closes the client's connection without
	// a byte of answer: "performed, never heard back".
	LoseAnswer
	// Stored500 forwards the request, then answers the client 500 with a
	// Stripe-shaped api_error body instead of the peer's answer, and, as
	// Stripe does once it has begun executing a request, stores that 500
	// for the request's Idempotency-Key: every later request with that key
	// gets the stored 500 again ("Idempotent-Replayed: true") and is not
	// forwarded, whatever the schedule says. A request without a key is
	// answered 500 once and nothing is stored.
	Stored500
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case LoseAnswer:
		return "lose-answer"
	case Stored500:
		return "stored-500"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Request is what a Schedule knows of a request when it chooses its mode.
type Request struct {
	// Seq numbers the requests the proxy received, from 1, in arrival
	// order.
	Seq int
	// Key is the Idempotency-Key header ("" if none).
	Key string
	// KeySeq numbers the requests with this Key, from 1 (0 without a key).
	KeySeq int
	// Method and Path are the request's.
	Method, Path string
}

// Schedule chooses the mode of each request. It is called with the proxy's
// lock held, one request at a time, so a deterministic schedule gives the
// same modes for the same sequence of requests.
type Schedule func(Request) Mode

// Always gives every request mode m.
func Always(m Mode) Schedule { return func(Request) Mode { return m } }

// FirstOfKey gives the first n requests of each Idempotency-Key mode m, and
// the later ones Pass. Requests without a key pass.
func FirstOfKey(n int, m Mode) Schedule {
	return func(r Request) Mode {
		if r.Key != "" && r.KeySeq <= n {
			return m
		}
		return Pass
	}
}

// Cycle gives request Seq the mode modes[(Seq-1) % len(modes)].
func Cycle(modes ...Mode) Schedule {
	return func(r Request) Mode { return modes[(r.Seq-1)%len(modes)] }
}

// KeyStats counts what happened to the requests of one Idempotency-Key.
type KeyStats struct {
	// Received counts the requests the proxy received.
	Received int
	// Forwarded counts those that reached the peer.
	Forwarded int
	// Performed counts the forwarded requests the peer performed: it
	// answered 2xx without "Idempotent-Replayed: true".
	Performed int
	// PeerReplays counts the forwarded requests the peer answered from its
	// store ("Idempotent-Replayed: true").
	PeerReplays int
	// Lost counts the answers the proxy withheld (LoseAnswer).
	Lost int
	// Stored500s counts the 500s the proxy stored (0 or 1), and
	// Replayed500s the requests it answered from that store, unforwarded.
	Stored500s, Replayed500s int
	// PeerStatuses are the statuses the peer answered, in order.
	PeerStatuses []int
	// Modes are the modes the requests got, in order; a request answered
	// from a stored 500 shows as "replayed-500".
	Modes []string
	// Last is when the proxy last received a request with this key.
	Last time.Time
}

// stored500 is the body of a 500 the proxy stores: what Stripe answers when
// it fails after it began executing a request.
const stored500 = `{"error":{"type":"api_error","message":"An unknown error occurred while processing your request."}}`

// FaultProxy is an HTTP proxy in front of one peer (a Stripe emulator) that
// loses answers and stores 500s by a Schedule, and counts, per
// Idempotency-Key, what reached the peer and what the peer performed.
//
// It listens on a free port of 127.0.0.1. It answers with "Connection:
// close", so every request comes on a connection of its own: net/http
// resends a request that carries an Idempotency-Key when a reused
// connection closes without an answer, which would turn one lost answer
// into a replay within a single attempt. With fresh connections a lost
// answer is seen by the client as exactly one failed request.
type FaultProxy struct {
	// URL is the proxy's base URL, http://127.0.0.1:PORT, to configure in
	// place of the peer's.
	URL string

	target   *url.URL
	srv      *http.Server
	ln       net.Listener
	client   *http.Client
	served   chan struct{}
	serveErr error

	mu       sync.Mutex
	schedule Schedule
	byKey    map[string]Schedule
	seq      int
	keys     map[string]*KeyStats
	stored   map[string]bool // keys with a stored 500
	log      []string
}

// NewFaultProxy starts a proxy in front of target (the peer's base URL)
// with schedule (nil: Always(Pass)). Close stops it.
func NewFaultProxy(target string, schedule Schedule) (*FaultProxy, error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("fault proxy: target %q: want http(s)://host:port", target)
	}
	if schedule == nil {
		schedule = Always(Pass)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	p := &FaultProxy{
		URL:      "http://" + ln.Addr().String(),
		target:   u,
		ln:       ln,
		client:   &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute},
		served:   make(chan struct{}),
		schedule: schedule,
		byKey:    map[string]Schedule{},
		keys:     map[string]*KeyStats{},
		stored:   map[string]bool{},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	p.srv.SetKeepAlivesEnabled(false)
	go func() {
		defer close(p.served)
		if err := p.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			p.serveErr = err
		}
	}()
	return p, nil
}

// Close stops the proxy: it closes the listener and every connection, and
// waits for the server's goroutine.
func (p *FaultProxy) Close() error {
	err := p.srv.Close()
	<-p.served
	p.client.CloseIdleConnections()
	return errors.Join(err, p.serveErr)
}

// SetSchedule replaces the schedule of the requests to come (per-key
// schedules set by SetKeySchedule still win).
func (p *FaultProxy) SetSchedule(s Schedule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.schedule = s
}

// SetKeySchedule gives the requests to come with Idempotency-Key key their
// own schedule; nil removes it.
func (p *FaultProxy) SetKeySchedule(key string, s Schedule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s == nil {
		delete(p.byKey, key)
		return
	}
	p.byKey[key] = s
}

// Stats returns a copy of the counts for key (zero if never seen).
func (p *FaultProxy) Stats(key string) KeyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok := p.keys[key]
	if !ok {
		return KeyStats{}
	}
	c := *st
	c.PeerStatuses = append([]int(nil), st.PeerStatuses...)
	c.Modes = append([]string(nil), st.Modes...)
	return c
}

// Keys returns the Idempotency-Keys seen, sorted ("" for requests without
// one).
func (p *FaultProxy) Keys() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ks := make([]string, 0, len(p.keys))
	for k := range p.keys {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Received returns how many requests the proxy has received.
func (p *FaultProxy) Received() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Log returns one line per request received (sequence, method, path, key,
// mode, the peer's status), for failure messages.
func (p *FaultProxy) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

// ServeHTTP handles one request by its mode.
func (p *FaultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "fault proxy: read request: "+err.Error(), http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")

	p.mu.Lock()
	p.seq++
	st := p.keys[key]
	if st == nil {
		st = &KeyStats{}
		p.keys[key] = st
	}
	st.Received++
	st.Last = time.Now()
	req := Request{Seq: p.seq, Key: key, Method: r.Method, Path: r.URL.Path}
	if key != "" {
		req.KeySeq = st.Received
	}
	if key != "" && p.stored[key] {
		st.Replayed500s++
		st.Modes = append(st.Modes, "replayed-500")
		p.log = append(p.log, fmt.Sprintf("#%d %s %s key=%s replayed-500 (not forwarded)", req.Seq, r.Method, r.URL.Path, key))
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Request-Id", fmt.Sprintf("req_proxy_%d", req.Seq))
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, stored500) //nolint:errcheck // the client's loss
		return
	}
	schedule := p.schedule
	if s, ok := p.byKey[key]; ok && key != "" {
		schedule = s
	}
	mode := schedule(req)
	st.Modes = append(st.Modes, mode.String())
	p.mu.Unlock()

	resp, respBody, err := p.forward(r.Context(), r, body)

	p.mu.Lock()
	line := fmt.Sprintf("#%d %s %s key=%s %s", req.Seq, r.Method, r.URL.Path, key, mode)
	if err != nil {
		line += " forward error: " + err.Error()
		p.log = append(p.log, line)
		p.mu.Unlock()
		// Not forwarded: answer as a gateway would. The mode is moot.
		http.Error(w, "fault proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	replayed := strings.EqualFold(resp.Header.Get("Idempotent-Replayed"), "true")
	st.Forwarded++
	st.PeerStatuses = append(st.PeerStatuses, resp.StatusCode)
	switch {
	case replayed:
		st.PeerReplays++
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		st.Performed++
	}
	line += fmt.Sprintf(" peer %d", resp.StatusCode)
	if replayed {
		line += " (peer replay)"
	}
	switch mode {
	case LoseAnswer:
		st.Lost++
	case Stored500:
		if key != "" {
			p.stored[key] = true
			st.Stored500s++
		}
	}
	p.log = append(p.log, line)
	p.mu.Unlock()

	switch mode {
	case LoseAnswer:
		// Performed; the answer never leaves.
		panic(http.ErrAbortHandler)
	case Stored500:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", fmt.Sprintf("req_proxy_%d", req.Seq))
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, stored500) //nolint:errcheck // the client's loss
	default:
		for name, values := range resp.Header {
			if hopByHop[http.CanonicalHeaderKey(name)] {
				continue
			}
			w.Header()[name] = values
		}
		w.WriteHeader(resp.StatusCode)
		w.Write(respBody) //nolint:errcheck // the client's loss
	}
}

// hopByHop are the headers a proxy does not pass on.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true,
}

// forward sends r, with body, to the peer and reads the whole answer.
func (p *FaultProxy) forward(ctx context.Context, r *http.Request, body []byte) (*http.Response, []byte, error) {
	u := *p.target
	u.Path = strings.TrimSuffix(p.target.Path, "/") + r.URL.Path
	u.RawQuery = r.URL.RawQuery
	// The peer performs what reached it even if the client has gone: do
	// not let the client's departure cancel the forwarded request.
	out, err := http.NewRequestWithContext(context.WithoutCancel(ctx), r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	for name, values := range r.Header {
		if hopByHop[http.CanonicalHeaderKey(name)] {
			continue
		}
		out.Header[name] = values
	}
	resp, err := p.client.Do(out)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	return resp, b, nil
}
