package failover

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
)

// performed counts, per effect key, the requests a fake provider
// performed.
type performed struct {
	mu sync.Mutex
	n  map[string]int
}

func (p *performed) add(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == nil {
		p.n = map[string]int{}
	}
	p.n[key]++
}

func (p *performed) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n[key]
}

// fakeWebhook is a webhook receiver that performs every delivery it gets,
// counting deliveries per webhook-id (the effect's key). A real receiver
// deduplicating on webhook-id would absorb a repeat; the count shows how
// often sidefx sent one.
func fakeWebhook() (*httptest.Server, *performed) {
	p := &performed{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
		id := r.Header.Get("webhook-id")
		if id == "" {
			http.Error(w, "no webhook-id", http.StatusBadRequest)
			return
		}
		p.add(id)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"received":true}`)
	}))
	return srv, p
}

// fakeSendGrid is SendGrid's Mail Send: every POST /v3/mail/send is a mail
// sent, counted per the sidefx_key custom argument the provider puts in
// each personalization (the effect's key), and answered 202 with an
// X-Message-Id, as SendGrid does.
func fakeSendGrid() (*httptest.Server, *performed) {
	p := &performed{}
	var mu sync.Mutex
	seq := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v3/mail/send" {
			http.NotFound(w, r)
			return
		}
		var body struct {
			Personalizations []struct {
				CustomArgs map[string]string `json:"custom_args"`
			} `json:"personalizations"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body); err != nil ||
			len(body.Personalizations) == 0 || body.Personalizations[0].CustomArgs["sidefx_key"] == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"errors":[{"message":"no sidefx_key"}]}`)
			return
		}
		p.add(body.Personalizations[0].CustomArgs["sidefx_key"])
		mu.Lock()
		seq++
		id := fmt.Sprintf("fakemsg%015d", seq)
		mu.Unlock()
		w.Header().Set("X-Message-Id", id)
		w.WriteHeader(http.StatusAccepted)
	}))
	return srv, p
}
