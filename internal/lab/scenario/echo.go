package scenario

import (
	"encoding/json"
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

// EchoReceiver is a hostile webhook receiver: every answer, whatever its
// status, echoes the whole request back — every header, the URL with its
// query and its user information (rebuilt from basic auth, as the client
// sent it), and the body — in the JSON body, in response headers
// (X-Echo-Authorization, X-Echo-Url) and in a Location header. A receiver
// that does this is careless, not rare; the sender must store and log none
// of the secrets it echoes.
//
// Which requests are refused is chosen by Status; the others are answered
// 200. It listens on a free port of 127.0.0.1.
type EchoReceiver struct {
	// URL is the base URL, http://127.0.0.1:PORT.
	URL string

	srv      *http.Server
	served   chan struct{}
	serveErr error

	mu       sync.Mutex
	status   func(seq int, r *http.Request) int
	requests []EchoedRequest
}

// EchoedRequest is one request an EchoReceiver received, as it echoed it.
type EchoedRequest struct {
	Seq     int                 `json:"seq"`
	Method  string              `json:"method"`
	URL     string              `json:"url"`
	Headers map[string][]string `json:"headers"`
	Body    string              `json:"body"`
	Status  int                 `json:"status"`
}

// NewEchoReceiver starts a receiver whose status for the seq-th request
// (from 1) is status(seq, r); nil answers 200 to all. Close stops it.
func NewEchoReceiver(status func(seq int, r *http.Request) int) (*EchoReceiver, error) {
	if status == nil {
		status = func(int, *http.Request) int { return http.StatusOK }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("echo receiver: %w", err)
	}
	e := &EchoReceiver{URL: "http://" + ln.Addr().String(), served: make(chan struct{}), status: status}
	e.srv = &http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		defer close(e.served)
		if err := e.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			e.serveErr = err
		}
	}()
	return e, nil
}

// UnauthorizedEvery answers 401 to every n-th request (n, 2n, …) and 200
// to the others.
func UnauthorizedEvery(n int) func(int, *http.Request) int {
	return func(seq int, _ *http.Request) int {
		if seq%n == 0 {
			return http.StatusUnauthorized
		}
		return http.StatusOK
	}
}

// Close stops the receiver and waits for its goroutine.
func (e *EchoReceiver) Close() error {
	err := e.srv.Close()
	<-e.served
	return errors.Join(err, e.serveErr)
}

// Requests returns the requests received so far, in order.
func (e *EchoReceiver) Requests() []EchoedRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]EchoedRequest(nil), e.requests...)
}

// ServeHTTP echoes r.
func (e *EchoReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	full := fullURL(r)
	e.mu.Lock()
	seq := len(e.requests) + 1
	status := e.status(seq, r)
	echo := EchoedRequest{Seq: seq, Method: r.Method, URL: full, Headers: r.Header.Clone(), Body: string(body), Status: status}
	e.requests = append(e.requests, echo)
	e.mu.Unlock()

	out, _ := json.Marshal(map[string]any{
		"id":      fmt.Sprintf("rcv_%d", seq),
		"message": fmt.Sprintf("you sent %s %s with Authorization %q", r.Method, full, r.Header.Get("Authorization")),
		"echo":    echo,
	})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", full)
	h.Set("X-Echo-Url", full)
	h.Set("X-Echo-Authorization", r.Header.Get("Authorization"))
	for _, name := range sortedHeaderNames(r.Header) {
		h.Set("X-Echo-"+name, strings.Join(r.Header[name], ", "))
	}
	w.WriteHeader(status)
	w.Write(out) //nolint:errcheck // the client's loss
}

// fullURL is the URL the client asked for, user information included
// (net/http sends it as basic auth and leaves it out of the request line).
func fullURL(r *http.Request) string {
	u := url.URL{Scheme: "http", Host: r.Host, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
	if user, pass, ok := r.BasicAuth(); ok {
		u.User = url.UserPassword(user, pass)
	}
	return u.String()
}

func sortedHeaderNames(h http.Header) []string {
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}
