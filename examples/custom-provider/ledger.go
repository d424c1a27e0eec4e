package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers"
)

// LedgerSettings are a ledger provider's own fields in sidefx.yaml.
type LedgerSettings struct {
	// URL is the ledger service's address. Required.
	URL string `yaml:"url"`
	// TokenEnv names the environment variable holding the bearer token.
	// Required.
	TokenEnv string `yaml:"token_env"`
	// KeyWindow is how long the ledger keeps entry keys. Default 72h.
	KeyWindow config.Duration `yaml:"key_window"`
}

// LedgerType is the provider type "ledger": its settings are checked at
// start-up with errors naming the field (providers["books"].url), and its
// token is read from the environment variable token_env names.
var LedgerType = config.NewProviderType("ledger", checkLedger, buildLedger)

func checkLedger(s *LedgerSettings, p *config.Problems) {
	if u, err := url.Parse(s.URL); s.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Add("url", "want the ledger's http(s) address, e.g. http://ledger.internal:8080")
	}
	if s.TokenEnv == "" {
		p.Add("token_env", "required: the name of the environment variable holding the ledger's token")
	}
	if s.KeyWindow < 0 {
		p.Add("key_window", "%s is negative", s.KeyWindow)
	}
}

func buildLedger(s *LedgerSettings, b *config.ProviderBuild) (providers.Provider, error) {
	window := time.Duration(s.KeyWindow)
	if window == 0 {
		window = 72 * time.Hour
	}
	token := b.Secret("token_env", s.TokenEnv)
	return &Ledger{
		name:     b.Name,
		endpoint: s.URL + "/entries",
		token:    token,
		window:   window,
		client:   &http.Client{Timeout: b.Timeout, Transport: providers.OneRequest(nil)},
		redact:   providers.NewRedactor(token),
	}, nil
}

// Ledger posts one entry per effect to the ledger service, which keeps
// each entry's key and answers a repeat with the entry it made: the
// provider is idempotent within the ledger's key window.
type Ledger struct {
	name, endpoint, token string
	window                time.Duration
	client                *http.Client
	redact                *providers.Redactor
}

func (l *Ledger) Name() string             { return l.name }
func (l *Ledger) Idempotent() bool         { return true }
func (l *Ledger) KeyWindow() time.Duration { return l.window }

// Call posts the entry and classifies the answer with the generic HTTP
// table: 2xx confirmed, 4xx rejected (429 and 408 retryable), 5xx and
// transport failures after sending unknown.
func (l *Ledger) Call(ctx context.Context, c providers.Call) providers.Result {
	body, err := json.Marshal(map[string]any{"key": c.Key, "source": c.SourceID, "entry": c.Payload})
	if err != nil {
		return providers.Reject(fmt.Errorf("payload: %w", err), nil)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.endpoint, bytes.NewReader(body))
	if err != nil {
		return providers.Reject(errors.New("ledger url: not usable"), nil)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+l.token)
	resp, err := l.client.Do(req)
	if err != nil {
		return l.redact.Result(providers.Unsure(fmt.Errorf("ledger: %w", err)))
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var entry struct {
		ID string `json:"id"`
	}
	switch {
	case resp.StatusCode/100 == 2:
		_ = json.Unmarshal(answer, &entry)
		return providers.Confirm(entry.ID, resp.Header.Get("Idempotent-Replayed") == "true", nil)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout:
		return l.redact.Result(providers.Retry(fmt.Errorf("ledger: %s", resp.Status), 0))
	case resp.StatusCode/100 == 4:
		return l.redact.Result(providers.Reject(fmt.Errorf("ledger: %s: %s", resp.Status, answer), nil))
	}
	return l.redact.Result(providers.Unsure(fmt.Errorf("ledger: %s", resp.Status)))
}
