package peers

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// client sends each request on a connection of its own, so that no idle
// connection (and goroutine) outlives a test.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func TestStripeMock(t *testing.T) {
	var (
		baseURL string
		p       *process
	)
	t.Run("answers", func(t *testing.T) {
		baseURL, p = startStripeMock(t)
		req, err := http.NewRequest(http.MethodGet, baseURL+"/v1/customers", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk_test_123")
		if code := status(t, req); code != http.StatusOK {
			t.Fatalf("GET /v1/customers: %d, want 200\n%s", code, p.output())
		}
	})
	if p == nil {
		t.FailNow()
	}
	checkGone(t, p, baseURL)
}

func TestPrism(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var s *PrismServer
	t.Run("answers", func(t *testing.T) {
		s = StartPrism(t, filepath.Join(root, "providers", "sendgrid", "testdata", "mail_send.oas.json"))
		body := `{"personalizations": [{"to": [{"email": "ada@example.com"}]}], "from": {"email": "shop@example.com"},
			"subject": "Hi", "content": [{"type": "text/plain", "value": "Hi"}]}`
		req, err := http.NewRequest(http.MethodPost, s.URL+"/v3/mail/send", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer SG.test")
		req.Header.Set("Content-Type", "application/json")
		if code := status(t, req); code != http.StatusAccepted {
			t.Fatalf("POST /v3/mail/send: %d, want 202\n%s", code, s.Output())
		}
	})
	if s == nil {
		t.FailNow()
	}
	checkGone(t, s.p, s.URL)
}

// status sends req and returns the status of the answer.
func status(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkGone fails the test unless, its test having ended, nothing is left
// of p's process group and nothing listens at baseURL.
func checkGone(t *testing.T, p *process, baseURL string) {
	t.Helper()
	if members := groupMembers(t, p.pgid); len(members) > 0 || !p.gone() {
		t.Fatalf("%s's process group %d outlived the cleanup: %v", p.name, p.pgid, members)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		t.Fatal(err)
	}
	if conn, err := net.DialTimeout("tcp", u.Host, time.Second); err == nil {
		conn.Close()
		t.Fatalf("%s still answers after the cleanup", baseURL)
	}
}

// groupMembers returns the pids of the processes in group pgid, from /proc
// (independently of process.gone).
func groupMembers(t *testing.T, pgid int) []int {
	t.Helper()
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, stat := range stats {
		b, err := os.ReadFile(stat)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid pgrp ...: comm may hold anything but ")".
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(stat)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// A helper that ignores SIGTERM and outlives the group's leader is killed,
// and stop reports the group gone.
func TestProcess_StopKillsTheWholeGroup(t *testing.T) {
	var p *process
	t.Run("run", func(t *testing.T) {
		p = start(t, "sh", "/bin/sh", []string{"-c", `(trap "" TERM; sleep 300) & exec sleep 300`}, nil)
		deadline := time.Now().Add(10 * time.Second)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for len(groupMembers(t, p.pgid)) < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the helper did not start: group %v", groupMembers(t, p.pgid))
			}
			<-tick.C
		}
		if err := p.stop(); err != nil {
			t.Fatal(err)
		}
	})
	if members := groupMembers(t, p.pgid); len(members) > 0 {
		t.Fatalf("left in group %d: %v", p.pgid, members)
	}
}

// A peer that exits before it listens, or that is missing, fails the test
// (it is not skipped) with what it wrote, or with how to install it.
func TestFailures(t *testing.T) {
	t.Run("exits before listening", func(t *testing.T) {
		msg := failure(t, func(tb testing.TB) {
			p := start(tb, "sh", "/bin/sh", []string{"-c", "echo no spec here; exit 3"}, nil)
			p.waitPort(tb, freeAddrs(tb, 1)[0], 10*time.Second)
		})
		for _, want := range []string{"sh exited before listening", "exit status 3", "no spec here"} {
			if !strings.Contains(msg, want) {
				t.Errorf("failure %q does not say %q", msg, want)
			}
		}
	})
	t.Run("stripe-mock missing", func(t *testing.T) {
		t.Setenv("SIDEFX_STRIPE_MOCK", filepath.Join(t.TempDir(), "stripe-mock"))
		if msg := failure(t, func(tb testing.TB) { StripeMock(tb) }); !strings.Contains(msg, "make deps") {
			t.Fatalf("failure %q does not say to run make deps", msg)
		}
	})
	t.Run("stripe-stateful-mock missing", func(t *testing.T) {
		t.Setenv("SIDEFX_STRIPE_STATEFUL", filepath.Join(t.TempDir(), "serve.js"))
		if msg := failure(t, func(tb testing.TB) { StripeStateful(tb) }); !strings.Contains(msg, "make deps") {
			t.Fatalf("failure %q does not say to run make deps", msg)
		}
	})
	t.Run("prism missing", func(t *testing.T) {
		t.Setenv("SIDEFX_PRISM", filepath.Join(t.TempDir(), "prism"))
		if msg := failure(t, func(tb testing.TB) { Prism(tb, "spec.json") }); !strings.Contains(msg, "make deps") {
			t.Fatalf("failure %q does not say to run make deps", msg)
		}
	})
}

// failure runs f with a testing.TB whose Fatal and Skip methods end f
// rather than t, and returns f's fatal message; it fails t unless f called
// Fatal or Fatalf.
func failure(t *testing.T, f func(testing.TB)) string {
	t.Helper()
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	if r.skipped || r.fatal == "" {
		t.Fatalf("skipped %t, fatal %q: want a fatal failure", r.skipped, r.fatal)
	}
	return r.fatal
}

// recorder is a testing.TB that records a fatal failure or skip and ends
// the goroutine, leaving the real test running.
type recorder struct {
	testing.TB
	fatal   string
	skipped bool
}

func (r *recorder) Helper()           {}
func (r *recorder) Fatal(args ...any) { r.fatal = fmt.Sprint(args...); runtime.Goexit() }
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) FailNow()                         { r.fatal = "FailNow"; runtime.Goexit() }
func (r *recorder) Skip(args ...any)                 { r.skipped = true; runtime.Goexit() }
func (r *recorder) Skipf(format string, args ...any) { r.skipped = true; runtime.Goexit() }
func (r *recorder) SkipNow()                         { r.skipped = true; runtime.Goexit() }

// stripe-stateful-mock keeps what it creates and replays by Idempotency-Key;
// this pins what the scenario tests and a reconciler may rely on, and what
// they may not (see StripeStatefulServer).
func TestStripeStateful(t *testing.T) {
	var s *StripeStatefulServer
	ok := t.Run("behaves as documented", func(t *testing.T) {
		s = StartStripeStateful(t)
		post := func(path, key string, form url.Values) (*http.Response, map[string]any) {
			t.Helper()
			req, err := http.NewRequest(http.MethodPost, s.URL+path, strings.NewReader(form.Encode()))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+StripeStatefulAPIKey)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			return do(t, req)
		}
		charge := func(amount, key string) url.Values {
			return url.Values{"amount": {amount}, "currency": {"usd"}, "source": {"tok_visa"}, "metadata[sidefx_key]": {key}}
		}

		// Created, and stored with its metadata.
		resp, first := post("/v1/charges", "key-1", charge("1000", "key-1"))
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(str(first["id"]), "ch_") || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("create: %d %v %v\n%s", resp.StatusCode, resp.Header, first, s.Output())
		}
		// The same key and parameters: the stored answer, nothing performed.
		resp, again := post("/v1/charges", "key-1", charge("1000", "key-1"))
		if resp.StatusCode != http.StatusOK || again["id"] != first["id"] || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("replay: %d %v id %v, want 200, Idempotent-Replayed, id %v", resp.StatusCode, resp.Header, again["id"], first["id"])
		}
		// The same key, other parameters: idempotency_error.
		resp, mismatch := post("/v1/charges", "key-1", charge("2000", "key-1"))
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(fmt.Sprint(mismatch["error"]), "idempotency_error") {
			t.Fatalf("reuse with other parameters: %d %v", resp.StatusCode, mismatch)
		}
		// tok_500: a 500, stored for the key and replayed, no charge.
		form500 := url.Values{"amount": {"1000"}, "currency": {"usd"}, "source": {"tok_500"}}
		if resp, _ := post("/v1/charges", "key-500", form500); resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("tok_500: %d, want 500", resp.StatusCode)
		}
		if resp, _ := post("/v1/charges", "key-500", form500); resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("tok_500 again: %d %v, want the stored 500 replayed", resp.StatusCode, resp.Header)
		}
		// No PaymentIntents, no search.
		if resp, _ := post("/v1/payment_intents", "key-pi", url.Values{"amount": {"1000"}, "currency": {"usd"}}); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("POST /v1/payment_intents: %d, want 404 (unsupported)", resp.StatusCode)
		}
		post("/v1/charges", "key-2", charge("1500", "key-2"))

		// Listed, with metadata; pages by limit and starting_after.
		all, err := s.Charges(t.Context(), StripeStatefulAPIKey)
		if err != nil {
			t.Fatal(err)
		}
		byKey := ChargesByMetadata(all, "sidefx_key")
		if len(all) != 2 || len(byKey["key-1"]) != 1 || byKey["key-1"][0].ID != first["id"] || len(byKey["key-2"]) != 1 || byKey["key-1"][0].Amount != 1000 {
			t.Fatalf("charges listed: %+v, want key-1's %v and key-2's", all, first["id"])
		}
		list := func(query string) int {
			t.Helper()
			req, err := http.NewRequest(http.MethodGet, s.URL+"/v1/charges?"+query, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+StripeStatefulAPIKey)
			resp, body := do(t, req)
			data, _ := body["data"].([]any)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /v1/charges?%s: %d %v", query, resp.StatusCode, body)
			}
			// Stripe's marks, which the stripe provider's listings take
			// for proof that the list is Stripe's (serve.js adds the
			// Request-Id the package sets only on keyed requests).
			if resp.Header.Get("Request-Id") == "" || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || body["object"] != "list" || body["data"] == nil {
				t.Fatalf("GET /v1/charges?%s: Request-Id %q, Content-Type %q, object %v: want Stripe's list, with a Request-Id", query,
					resp.Header.Get("Request-Id"), resp.Header.Get("Content-Type"), body["object"])
			}
			return len(data)
		}
		if n := list("limit=1"); n != 1 {
			t.Fatalf("limit=1 listed %d", n)
		}
		// Filters it ignores: creation time and metadata.
		if n := list(url.Values{"created[gte]": {"99999999999"}}.Encode()); n != 2 {
			t.Fatalf("created[gte] in the far future listed %d charges; it was ignored before (2)", n)
		}
		if n := list(url.Values{"metadata[sidefx_key]": {"key-2"}}.Encode()); n != 2 {
			t.Fatalf("a metadata filter listed %d charges; it was ignored before (2)", n)
		}
		// Keys must start with sk_test_.
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/v1/charges", nil)
		req.Header.Set("Authorization", "Bearer sk_live_nope")
		if code := status(t, req); code != http.StatusUnauthorized {
			t.Fatalf("sk_live_ key: %d, want 401", code)
		}
	})
	if s == nil {
		if ok {
			t.Skip("stripe-stateful-mock is not installed (the subtest says how to install it)")
		}
		t.FailNow()
	}
	checkGone(t, s.p, s.URL)
}

// do sends req and returns the answer, its JSON body decoded (nil if it is
// not a JSON object).
func do(t *testing.T, req *http.Request) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp, m
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
