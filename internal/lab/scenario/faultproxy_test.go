package scenario

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// keyedPeer is a minimal Stripe-like peer: it performs each
// Idempotency-Key once and replays its answer for the key after that.
type keyedPeer struct {
	mu        sync.Mutex
	performed map[string]int
}

func (p *keyedPeer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	p.mu.Lock()
	p.performed[key]++
	n := p.performed[key]
	p.mu.Unlock()
	if n > 1 && key != "" {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	fmt.Fprintf(w, `{"id":"ch_%s","path":%q,"query":%q}`, key, r.URL.Path, r.URL.RawQuery)
}

func (p *keyedPeer) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.performed[key]
}

func newProxy(t *testing.T, s Schedule) (*FaultProxy, *keyedPeer) {
	t.Helper()
	peer := &keyedPeer{performed: map[string]int{}}
	srv := httptest.NewServer(peer)
	t.Cleanup(srv.Close)
	p, err := NewFaultProxy(srv.URL, s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
	})
	return p, peer
}

// send posts to the proxy with key and returns the status, the body and
// the Idempotent-Replayed header, or the error.
func send(t *testing.T, p *FaultProxy, key string) (int, string, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, p.URL+"/v1/charges?x=1", strings.NewReader(url.Values{"amount": {"100"}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed"), nil
}

func TestFaultProxy_Modes(t *testing.T) {
	t.Parallel()
	t.Run("pass", func(t *testing.T) {
		p, peer := newProxy(t, nil)
		code, body, _, err := send(t, p, "k1")
		if err != nil || code != 200 || !strings.Contains(body, `"ch_k1"`) || !strings.Contains(body, `"x=1"`) {
			t.Fatalf("%d %q %v", code, body, err)
		}
		if code, _, replayed, _ := send(t, p, "k1"); code != 200 || replayed != "true" {
			t.Fatalf("second: %d replayed %q", code, replayed)
		}
		st := p.Stats("k1")
		if st.Received != 2 || st.Forwarded != 2 || st.Performed != 1 || st.PeerReplays != 1 || peer.count("k1") != 2 {
			t.Fatalf("stats %+v, peer saw %d", st, peer.count("k1"))
		}
	})
	t.Run("lose the answer", func(t *testing.T) {
		p, peer := newProxy(t, FirstOfKey(1, LoseAnswer))
		if code, body, _, err := send(t, p, "k1"); err == nil {
			t.Fatalf("a lost answer arrived: %d %q", code, body)
		}
		if peer.count("k1") != 1 {
			t.Fatalf("the peer saw the request %d times, want 1: the answer is lost after it performed", peer.count("k1"))
		}
		if code, _, replayed, err := send(t, p, "k1"); err != nil || code != 200 || replayed != "true" {
			t.Fatalf("the retry: %d replayed %q %v", code, replayed, err)
		}
		if st := p.Stats("k1"); st.Lost != 1 || st.Performed != 1 || st.PeerReplays != 1 || strings.Join(st.Modes, ",") != "lose-answer,pass" {
			t.Fatalf("stats %+v", st)
		}
	})
	t.Run("stored 500", func(t *testing.T) {
		p, peer := newProxy(t, FirstOfKey(1, Stored500))
		code, body, replayed, err := send(t, p, "k1")
		if err != nil || code != 500 || replayed != "" || !strings.Contains(body, `"api_error"`) {
			t.Fatalf("first: %d %q replayed %q %v", code, body, replayed, err)
		}
		for range 3 {
			code, body, replayed, err := send(t, p, "k1")
			if err != nil || code != 500 || replayed != "true" || !strings.Contains(body, `"api_error"`) {
				t.Fatalf("later: %d %q replayed %q %v", code, body, replayed, err)
			}
		}
		if peer.count("k1") != 1 {
			t.Fatalf("the peer saw %d requests, want only the first: the stored 500 is replayed without forwarding", peer.count("k1"))
		}
		if st := p.Stats("k1"); st.Performed != 1 || st.Forwarded != 1 || st.Stored500s != 1 || st.Replayed500s != 3 {
			t.Fatalf("stats %+v", st)
		}
		// Another key is untouched by k1's stored 500.
		if code, _, _, _ := send(t, p, "k2"); code != 500 {
			t.Fatalf("k2's first request: %d, want its own stored 500", code)
		}
		if code, _, _, _ := send(t, p, ""); code != 200 {
			t.Fatalf("a request without a key: %d, want it passed", code)
		}
	})
	t.Run("schedules", func(t *testing.T) {
		p, _ := newProxy(t, Cycle(Pass, LoseAnswer))
		_, _, _, err1 := send(t, p, "a")
		_, _, _, err2 := send(t, p, "b")
		_, _, _, err3 := send(t, p, "c")
		if err1 != nil || err2 == nil || err3 != nil {
			t.Fatalf("cycle pass, lose: %v %v %v", err1, err2, err3)
		}
		p.SetKeySchedule("d", Always(Stored500))
		if code, _, _, _ := send(t, p, "d"); code != 500 {
			t.Fatalf("per-key schedule: %d", code)
		}
		p.SetSchedule(Always(Pass))
		if _, _, _, err := send(t, p, "e"); err != nil {
			t.Fatalf("after SetSchedule: %v", err)
		}
		if got := strings.Join(p.Keys(), ","); got != "a,b,c,d,e" || p.Received() != 5 {
			t.Fatalf("keys %s, received %d", got, p.Received())
		}
	})
}

func TestEchoReceiver_EchoesEverything(t *testing.T) {
	t.Parallel()
	rcv, err := NewEchoReceiver(UnauthorizedEvery(2))
	if err != nil {
		t.Fatal(err)
	}
	defer rcv.Close()
	target := strings.Replace(rcv.URL, "http://", "http://u:pw-secret@", 1) + "/hook?token=q-secret"
	for i, want := range []int{200, 401} {
		req, _ := http.NewRequest(http.MethodPost, target, strings.NewReader(`{"n":1}`))
		req.Header.Set("X-Token", "h-secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
		for _, s := range []string{"pw-secret", "q-secret", "h-secret", `{\"n\":1}`} {
			if !strings.Contains(string(b), s) {
				t.Fatalf("request %d: the answer does not echo %s: %s", i+1, s, b)
			}
		}
		if loc := resp.Header.Get("Location"); !strings.Contains(loc, "u:pw-secret@") || !strings.Contains(loc, "token=q-secret") {
			t.Fatalf("Location %q does not echo the URL", loc)
		}
		if resp.Header.Get("X-Echo-X-Token") != "h-secret" {
			t.Fatalf("headers %v do not echo X-Token", resp.Header)
		}
	}
	if n := len(rcv.Requests()); n != 2 {
		t.Fatalf("%d requests recorded", n)
	}
}
