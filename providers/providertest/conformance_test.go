package providertest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	broken      string // "" for the contract; see brokenMisclassify, brokenLeak
	hc          *http.Client
	redact      *providers.Redactor
}

// The ways a refProvider can break the contract, for the tests that show
// the suite catches each.
const (
	// brokenMisclassify classifies every transport error as retryable.
	brokenMisclassify = "misclassify"
	// brokenLeak keeps the peer's answer without redacting it.
	brokenLeak = "leak"
	// brokenAny2xx confirms any 2xx, whoever answered it.
	brokenAny2xx = "any2xx"
	// brokenAbsent takes any 2xx to a lookup for the peer's listing.
	brokenAbsent = "absent"
)

func newRefProvider(baseURL, secret, broken string) *refProvider {
	u := baseURL + "/effects?token=" + url.QueryEscape(refToken)
	return &refProvider{
		url: u, secret: secret, idempotent: true, broken: broken,
		hc: &http.Client{Transport: providers.OneRequest(nil),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		redact: providers.NewRedactor(append(providers.URLSecrets(u), secret)...),
	}
}

func (p *refProvider) Name() string     { return "ref" }
func (p *refProvider) Idempotent() bool { return p.idempotent }

func (p *refProvider) Call(ctx context.Context, c providers.Call) providers.Result {
	r := p.call(ctx, c)
	if p.broken == brokenLeak {
		return r
	}
	return p.redact.Result(r)
}

func (p *refProvider) call(ctx context.Context, c providers.Call) providers.Result {
	var obj map[string]any
	if err := json.Unmarshal(c.Payload, &obj); err != nil || obj == nil {
		return providers.Reject(errors.New("ref: payload is not a JSON object"), nil)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.url, bytes.NewReader(c.Payload))
	if err != nil {
		return providers.Reject(fmt.Errorf("ref: %w", err), nil)
	}
	req.Header.Set("Authorization", "Bearer "+p.secret)
	req.Header.Set("Idempotency-Key", c.Key)
	resp, err := p.hc.Do(req)
	if err != nil {
		if p.broken == brokenMisclassify {
			return providers.Retry(errors.New("ref: transport error"), 0)
		}
		return providers.TransportResult("ref", errors.Unwrap(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	detail, _ := json.Marshal(map[string]string{"status": resp.Status, "body": string(body), "location": resp.Header.Get("Location")})
	switch providers.ClassifyStatus(resp.StatusCode) {
	case providers.Confirmed:
		var ok struct{ ID string }
		_ = json.Unmarshal(body, &ok)
		// The peer's proof: JSON with an id, and its X-Ref-Request header.
		if p.broken != brokenAny2xx && (ok.ID == "" || resp.Header.Get("X-Ref-Request") == "" || !providers.HasMediaType(resp.Header, "application/json")) {
			return providers.NotProven("ref", resp.StatusCode, "no id, X-Ref-Request or JSON")
		}
		return providers.Confirm(ok.ID, resp.Header.Get("Idempotent-Replayed") == "true", detail)
	case providers.Retryable:
		return providers.Retry(fmt.Errorf("ref: %s", resp.Status), providers.RetryAfter(resp.Header, time.Now()))
	case providers.Rejected:
		return providers.Reject(fmt.Errorf("ref: %s", resp.Status), detail)
	}
	r := providers.Unsure(fmt.Errorf("ref: %s: %s", resp.Status, body))
	r.Detail = detail
	return r
}

var _ providers.Looker = (*refProvider)(nil)

// Lookup asks the peer for the objects made under q.Key (GET with the key
// in the query), and reads its answer only when it is the peer's own: a
// 200 with JSON, its X-Ref-Request header, and a "data" array. Absent when
// that array is empty.
func (p *refProvider) Lookup(ctx context.Context, q providers.Query) (providers.Evidence, error) {
	ev := providers.Evidence{Verdict: providers.NotKnown, Source: "ref lookup"}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"&key="+url.QueryEscape(q.Key), nil)
	if err != nil {
		return ev, fmt.Errorf("ref: lookup: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+p.secret)
	resp, err := p.hc.Do(req)
	if err != nil {
		return ev, errors.New("ref: lookup: transport error")
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var list struct {
		Data *[]struct{ ID string } `json:"data"`
	}
	jerr := json.Unmarshal(body, &list)
	switch {
	case p.broken == brokenAbsent && resp.StatusCode/100 == 2:
	case resp.StatusCode != http.StatusOK || jerr != nil || list.Data == nil || resp.Header.Get("X-Ref-Request") == "" || !providers.HasMediaType(resp.Header, "application/json"):
		return ev, providers.NotProvenError("ref: lookup", resp.StatusCode, "no JSON list with X-Ref-Request")
	}
	if list.Data == nil || len(*list.Data) == 0 {
		ev.Verdict = providers.Absent
		return ev, nil
	}
	ev.Verdict, ev.Ref, ev.Succeeded = providers.Found, (*list.Data)[0].ID, true
	return ev, nil
}

// ConsistencyDelay is a minute.
func (p *refProvider) ConsistencyDelay() time.Duration { return time.Minute }

const (
	refSecret = "sk_ref_secret_123"
	refToken  = "tok/ref+query=secret" // escaped on the wire
)

func refConformance(broken string) providertest.Conformance {
	return providertest.Conformance{
		New: func(t *testing.T, baseURL string) providers.Provider {
			return newRefProvider(baseURL, refSecret, broken)
		},
		Kind:       "ref.create",
		Payload:    json.RawMessage(`{"amount":1}`),
		BadPayload: json.RawMessage(`[1,2]`),
		Secrets:    []string{refSecret, refToken},
		Key:        func(r *http.Request, _ []byte) string { return r.Header.Get("Idempotency-Key") },
		Respond: func(w http.ResponseWriter, r *http.Request, a providertest.Answer, echo string) {
			body, _ := json.Marshal(map[string]string{"id": providertest.ConformanceRef, "echo": echo})
			switch a {
			case providertest.AnswerOK, providertest.AnswerReplay:
				if a == providertest.AnswerReplay {
					w.Header().Set("Idempotent-Replayed", "true")
				}
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("X-Ref-Request", "req_1")
				w.Write(body)
			case providertest.AnswerReject:
				http.Error(w, "declined: "+echo, http.StatusPaymentRequired)
			case providertest.AnswerUnauthorized:
				http.Error(w, "who are you? "+echo, http.StatusUnauthorized)
			case providertest.AnswerForbidden:
				http.Error(w, "not for you: "+echo, http.StatusForbidden)
			case providertest.AnswerNotFound:
				http.Error(w, "no such route: "+echo, http.StatusNotFound)
			case providertest.AnswerInvalid:
				http.Error(w, "invalid: "+echo, http.StatusBadRequest)
			case providertest.AnswerUnavailable:
				http.Error(w, "down: "+echo, http.StatusServiceUnavailable)
			case providertest.AnswerServerError:
				http.Error(w, "crashed: "+echo, http.StatusInternalServerError)
			case providertest.AnswerConflict:
				http.Error(w, "in progress: "+echo, http.StatusConflict)
			case providertest.AnswerSeeOther:
				w.WriteHeader(http.StatusSeeOther)
			case providertest.AnswerRateLimited:
				w.Header().Set("Retry-After", "7")
				http.Error(w, "slow down: "+echo, http.StatusTooManyRequests)
			}
		},
	}
}

func TestConformance_ReferenceProvider(t *testing.T) {
	providertest.RunConformance(t, refConformance(os.Getenv("SIDEFX_CONFORMANCE_BROKEN")))
}

// The suite can fail: a provider that breaks the contract is caught, with
// a message that says how.
func TestConformance_CatchesBrokenProviders(t *testing.T) {
	for _, tc := range []struct {
		broken string
		says   []string
	}{
		// Calling a timeout "retryable" would resend an email whose
		// answer was lost.
		{brokenMisclassify, []string{"timeout_is_unknown", "want unknown"}},
		// A provider that keeps what its peer echoes stores its secrets.
		{brokenLeak, []string{"no_secret_in_any_result", "holds the secrets", refSecret, refToken}},
		// A provider that confirms any 2xx takes a proxy's page for its
		// peer's confirmation.
		{brokenAny2xx, []string{"a_proxy's_200_HTML_page_is_not_confirmed", "an intermediary's answer"}},
		// A provider that reads any 2xx as its peer's listing tells the
		// operator the peer never got an effect it may have performed.
		{brokenAbsent, []string{"an_intermediary's_answer_to_a_lookup_is_not_known/a_200_empty_JSON_object", "made the lookup absent"}},
	} {
		t.Run(tc.broken, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformance_ReferenceProvider$")
			cmd.Env = append(os.Environ(), "SIDEFX_CONFORMANCE_BROKEN="+tc.broken)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed a provider broken by %s:\n%s", tc.broken, out)
			}
			for _, want := range tc.says {
				if !strings.Contains(string(out), want) {
					t.Fatalf("the failure does not mention %q:\n%s", want, out)
				}
			}
		})
	}
}
