package peers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// stripeStatefulStartTimeout bounds stripe-stateful-mock's start (under a
// second on a developer machine: it is one node process).
const stripeStatefulStartTimeout = 30 * time.Second

// StripeStatefulAPIKey is an API key stripe-stateful-mock accepts: it
// refuses every key that does not start with "sk_test_" (401). Any such key
// works, and all of them see the same objects.
const StripeStatefulAPIKey = "sk_test_sidefx_stateful_peer"

// StripeStatefulServer is a stripe-stateful-mock started by
// StartStripeStateful: a Stripe emulator that, unlike stripe-mock, keeps
// what it creates and replays answers by Idempotency-Key.
//
// What version 0.0.16 (tools/stripe-stateful-mock) does, as measured by
// TestStripeStateful:
//
//   - POST /v1/charges with amount, currency and a test token as source
//     (tok_visa…) creates and stores a charge (ch_…) with the metadata
//     given. No PaymentIntents: /v1/payment_intents answers 404 "No
//     matching path", as does /v1/search/*. Also charges retrieve, update
//     and capture, refunds, customers and cards, products, plans, prices,
//     subscriptions, tax rates, connect accounts.
//   - Idempotency-Key: a request with a key seen before, on the same method
//     and path, with the same parameters, gets the stored status and body
//     again with "Idempotent-Replayed: true" and "Original-Request", and
//     performs nothing. Other parameters: 400 idempotency_error. Answers
//     stored are every status but 401 and 429, validation 400s included
//     (Stripe stores none of those). Keys are scoped by method and path (on
//     another endpoint a key is a new key; Stripe refuses it) and never
//     expire (Stripe may forget them after 24 hours).
//   - GET /v1/charges lists stored charges, newest second first, with
//     metadata; every charge when there is no limit (Stripe's default is
//     10). Filters honoured: customer, limit, starting_after,
//     ending_before. Ignored without error: created[gte] and the other
//     created filters, metadata filters. Listing by creation time or
//     metadata must therefore list everything and filter on the client.
//   - The source tokens tok_500 and tok_429 answer 500 and 429 without
//     creating a charge (the 500 is stored for the key, the 429 is not);
//     "tok_a|tok_b|…" answers as each token in turn on successive uses.
//   - The API key must start with sk_test_, by Bearer or basic auth.
//   - Every answer is JSON with a Request-Id, as Stripe's are: serve.js
//     labels each application/json and gives it a Request-Id (the package
//     sets one only on a request with an Idempotency-Key, none on a
//     listing), which the stripe provider takes for proof.
type StripeStatefulServer struct {
	// URL is the base URL, http://127.0.0.1:PORT.
	URL string

	p *process
}

// StripeStateful starts stripe-stateful-mock for the test and returns its
// base URL. See StartStripeStateful.
func StripeStateful(t testing.TB) string {
	t.Helper()
	return StartStripeStateful(t).URL
}

// StartStripeStateful starts stripe-stateful-mock on a free port of
// 127.0.0.1 and returns once it answers an authenticated request (within a
// deadline). It is stopped in t.Cleanup.
//
// The executable is $SIDEFX_STRIPE_STATEFUL, else node running
// tools/stripe-stateful-mock/serve.js under RepoRoot, which starts the
// package `make deps` installs there (npm ci) on HOST and PORT (the
// package's own command listens on every interface). It is given HOST,
// PORT and LOG_LEVEL in its environment. When it is missing the test is
// skipped, saying how to install it, unless CI=true, where it fails.
func StartStripeStateful(t testing.TB) *StripeStatefulServer {
	t.Helper()
	bin, args := stripeStatefulCommand(t)
	// A free port is free when picked, not when the server binds it:
	// another test's process may take it between the two (a clean clone's
	// run once connected "after 0s" to something else, then was refused).
	// Ready means the server answers a request, checked by polling; a
	// server that exits (its port taken) is started again on another.
	for try := 1; ; try++ {
		addr := freeAddrs(t, 1)[0]
		_, port, _ := net.SplitHostPort(addr)
		p := start(t, "stripe-stateful-mock", bin, args, []string{"HOST=127.0.0.1", "PORT=" + port, "LOG_LEVEL=info"})
		s := &StripeStatefulServer{URL: "http://" + addr, p: p}
		err := s.waitAnswering(stripeStatefulStartTimeout)
		if err == nil {
			return s
		}
		select {
		case <-p.exited:
			if try < 3 {
				t.Logf("stripe-stateful-mock exited on %s (%v), trying another port", addr, p.waitErr)
				continue
			}
		default:
		}
		t.Fatalf("stripe-stateful-mock does not answer GET /v1/charges on %s: %v\n%s", addr, err, p.tail())
	}
}

// waitAnswering polls GET /v1/charges until it answers, the server exits,
// or timeout passes.
func (s *StripeStatefulServer) waitAnswering(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := s.Charges(rctx, StripeStatefulAPIKey)
		rcancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.p.exited:
			return fmt.Errorf("it exited: %v (last answer: %w)", s.p.waitErr, err)
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

// Output returns everything the server has written so far.
func (s *StripeStatefulServer) Output() string {
	return s.p.output()
}

// Stop stops the server before the test ends, as its cleanup would.
func (s *StripeStatefulServer) Stop() error {
	return s.p.stop()
}

// StripeCharge is what the scenario tests read of a stored charge.
type StripeCharge struct {
	ID       string            `json:"id"`
	Amount   int64             `json:"amount"`
	Currency string            `json:"currency"`
	Created  int64             `json:"created"`
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
}

// Charges lists every charge the server holds, page by page (limit and
// starting_after, which it honours), with apiKey.
func (s *StripeStatefulServer) Charges(ctx context.Context, apiKey string) ([]StripeCharge, error) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var all []StripeCharge
	after := ""
	for {
		q := url.Values{"limit": {"100"}}
		if after != "" {
			q.Set("starting_after", after)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/v1/charges?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("list charges: %w", err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("list charges: %w", err)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("list charges: %s: %s", resp.Status, body)
		}
		var page struct {
			Data    []StripeCharge `json:"data"`
			HasMore bool           `json:"has_more"`
		}
		if err := json.Unmarshal(body, &page); err != nil {
			return nil, fmt.Errorf("list charges: %w", err)
		}
		all = append(all, page.Data...)
		if !page.HasMore || len(page.Data) == 0 {
			return all, nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

// ChargesByMetadata groups charges by the value of one metadata key
// (sidefx_key, say); charges without it are left out.
func ChargesByMetadata(charges []StripeCharge, key string) map[string][]StripeCharge {
	m := map[string][]StripeCharge{}
	for _, c := range charges {
		if v, ok := c.Metadata[key]; ok {
			m[v] = append(m[v], c)
		}
	}
	return m
}

// stripeStatefulCommand returns the command that runs stripe-stateful-mock
// ($SIDEFX_STRIPE_STATEFUL, else node serve.js), or ends the test: skipped
// outside CI, failed in CI, saying how to install it.
func stripeStatefulCommand(t testing.TB) (string, []string) {
	t.Helper()
	if bin := envBinary(t, "SIDEFX_STRIPE_STATEFUL"); bin != "" {
		return bin, nil
	}
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "tools", "stripe-stateful-mock")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "stripe-stateful-mock", "package.json"))
	}
	if err != nil {
		msg := fmt.Sprintf("stripe-stateful-mock, the stateful Stripe peer, is not installed in %s (%v): run `make deps` at the repository root, or set SIDEFX_STRIPE_STATEFUL", dir, err)
		if InCI() {
			t.Fatal(msg)
		}
		t.Skip(msg + " (skipped outside CI; with CI=true this fails)")
	}
	return node, []string{filepath.Join(dir, "serve.js")}
}

// InCI reports whether the tests run in CI (CI=true), where a missing peer
// fails a test instead of skipping it.
func InCI() bool {
	return strings.EqualFold(os.Getenv("CI"), "true")
}
