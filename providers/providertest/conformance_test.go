package providertest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// refProvider is a minimal HTTP provider written to the contract: the
// reference the conformance suite is checked against.
type refProvider struct {
	url, secret string
	idempotent  bool
	broken      bool // classifies every transport error as retryable: wrong
}

func (p *refProvider) Name() string     { return "ref" }
func (p *refProvider) Idempotent() bool { return p.idempotent }

func (p *refProvider) Call(ctx context.Context, c providers.Call) providers.Result {
	var obj map[string]any
	if err := json.Unmarshal(c.Payload, &obj); err != nil || obj == nil {
		return providers.Reject(errors.New("ref: payload is not a JSON object"), nil)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url+"/effects", bytes.NewReader(c.Payload))
	if err != nil {
		return providers.Reject(fmt.Errorf("ref: %w", err), nil)
	}
	req.Header.Set("Authorization", "Bearer "+p.secret)
	req.Header.Set("Idempotency-Key", c.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if p.broken {
			return providers.Retry(errors.New("ref: transport error"), 0)
		}
		return providers.TransportResult("ref", errors.Unwrap(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	switch providers.ClassifyStatus(resp.StatusCode) {
	case providers.Confirmed:
		var ok struct{ ID string }
		_ = json.Unmarshal(body, &ok)
		return providers.Confirm(ok.ID, resp.Header.Get("Idempotent-Replayed") == "true", nil)
	case providers.Retryable:
		return providers.Retry(fmt.Errorf("ref: %s", resp.Status), providers.RetryAfter(resp.Header, time.Now()))
	case providers.Rejected:
		return providers.Reject(fmt.Errorf("ref: %s", resp.Status), body)
	}
	return providers.Unsure(fmt.Errorf("ref: %s", resp.Status))
}

func refConformance(broken bool) providertest.Conformance {
	const secret = "sk_ref_secret_123"
	return providertest.Conformance{
		New: func(t *testing.T, baseURL string) providers.Provider {
			return &refProvider{url: baseURL, secret: secret, idempotent: true, broken: broken}
		},
		Kind:       "ref.create",
		Payload:    json.RawMessage(`{"amount":1}`),
		BadPayload: json.RawMessage(`[1,2]`),
		Secrets:    []string{secret},
		Key:        func(r *http.Request, _ []byte) string { return r.Header.Get("Idempotency-Key") },
		Respond: func(w http.ResponseWriter, r *http.Request, a providertest.Answer) {
			switch a {
			case providertest.AnswerOK, providertest.AnswerReplay:
				if a == providertest.AnswerReplay {
					w.Header().Set("Idempotent-Replayed", "true")
				}
				fmt.Fprintf(w, `{"id":%q}`, providertest.ConformanceRef)
			case providertest.AnswerReject:
				http.Error(w, `{"error":"declined"}`, http.StatusPaymentRequired)
			case providertest.AnswerUnavailable:
				http.Error(w, "down", http.StatusServiceUnavailable)
			case providertest.AnswerRateLimited:
				w.Header().Set("Retry-After", "7")
				http.Error(w, "slow down", http.StatusTooManyRequests)
			}
		},
	}
}

func TestConformance_ReferenceProvider(t *testing.T) {
	if os.Getenv("SIDEFX_CONFORMANCE_BROKEN") != "" {
		providertest.RunConformance(t, refConformance(true))
		return
	}
	providertest.RunConformance(t, refConformance(false))
}

// The suite can fail: a provider that calls a timeout "retryable" (which
// would resend an email whose answer was lost) is caught.
func TestConformance_CatchesMisclassification(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestConformance_ReferenceProvider$")
	cmd.Env = append(os.Environ(), "SIDEFX_CONFORMANCE_BROKEN=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed a provider that misclassifies timeouts:\n%s", out)
	}
	for _, want := range []string{"timeout_is_unknown", "want unknown"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the failure does not mention %q:\n%s", want, out)
		}
	}
}
