package httpbound

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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
	b := NewBudget(BudgetConfig{Total: 100, PerClient: 100})
	hold := make(chan struct{})
	entered := make(chan struct{})
	h := b.Limit(60, "a test body", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			entered <- struct{}{}
			<-hold
		}
		if _, err := Body(r, 60); err != nil {
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

// One client holding bodies it never finishes holds its share of the
// budget at most: another client's body is still read and answered.
func TestBudget_OneClientHoldsItsShareOnly(t *testing.T) {
	t.Parallel()
	b := NewBudget(BudgetConfig{Total: 64 << 10, PerClient: 16 << 10})
	h := b.Limit(8<<10, "a test body", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := Body(r, 8<<10); err != nil {
			t.Errorf("Body: %v", err)
		}
	}))
	// The first client: bodies declaring 8 KiB, each sending 5 KiB and
	// stopping, until one is refused.
	type held struct {
		pw   *io.PipeWriter
		done chan int
	}
	var holding []held
	defer func() {
		for _, c := range holding {
			c.pw.CloseWithError(io.ErrUnexpectedEOF)
			<-c.done
		}
	}()
	refused := false
	for i := 0; i < 64 && !refused; i++ {
		pr, pw := io.Pipe()
		r := httptest.NewRequest(http.MethodPost, "/", pr)
		r.RemoteAddr, r.ContentLength = "198.51.100.7:40000", 8<<10
		c := held{pw: pw, done: make(chan int, 1)}
		go func() { w := httptest.NewRecorder(); h.ServeHTTP(w, r); c.done <- w.Code }()
		wrote := make(chan error, 1)
		go func() { _, err := pw.Write(make([]byte, 5<<10)); wrote <- err }()
		select {
		case err := <-wrote: // read: the body is held
			if err != nil {
				t.Fatalf("body %d: %v", i, err)
			}
			holding = append(holding, c)
		case code := <-c.done: // refused before reading it all
			if code != http.StatusServiceUnavailable {
				t.Fatalf("body %d of the first client: %d, want 503", i, code)
			}
			pw.Close()
			refused = true
		}
	}
	if !refused {
		t.Fatalf("64 bodies of 8 KiB from one client all held; its share is 16 KiB")
	}
	if got := b.Used(); got > 16<<10 {
		t.Fatalf("one client holds %d bytes, its share is %d", got, 16<<10)
	}
	// Another client, in the first one's IPv4 /24 and from an IPv6 /64:
	// read and answered.
	for _, addr := range []string{"198.51.100.8:40000", "[2001:db8:7:9::1]:40000"} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(strings.Repeat("x", 8<<10)))
		r.RemoteAddr = addr
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("a body of another client (%s) while the first holds its share: %d\n%s", addr, w.Code, w.Body.String())
		}
	}
}

// A body declared and never sent is cut after the grace, with 408, long
// before the server's read timeout; one sent at pace is read.
func TestBudget_IdleBodyIsCutAfterTheGrace(t *testing.T) {
	t.Parallel()
	b := NewBudget(BudgetConfig{Total: 1 << 20, Grace: 200 * time.Millisecond})
	srv := httptest.NewUnstartedServer(b.Limit(64<<10, "a test body", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})))
	srv.Config.ReadTimeout = 10 * time.Minute
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // the test's own bound, not the daemon's
	if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a body declared and never sent: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("a body declared and never sent: %d, want 408", resp.StatusCode)
	}
	if got := b.Used(); got != 0 {
		t.Fatalf("reserved %d after the idle body was cut", got)
	}
	resp2, err := http.Post(srv.URL, "text/plain", strings.NewReader(strings.Repeat("x", 64<<10)))
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if resp2.StatusCode != http.StatusOK {
		t.Fatalf("a body sent at once: %d", resp2.StatusCode)
	}
}
