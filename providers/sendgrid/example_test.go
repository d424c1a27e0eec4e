package sendgrid_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"

	"github.com/sidefx/sidefx/derive"
	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
)

// A receipt mail, sent to a local server that answers as SendGrid does.
func Example() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var mail struct {
			Personalizations []struct {
				CustomArgs map[string]string `json:"custom_args"`
			} `json:"personalizations"`
			Headers map[string]string `json:"headers"`
		}
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &mail) //nolint:errcheck
		fmt.Println("custom_args:", mail.Personalizations[0].CustomArgs)
		fmt.Println("header:", mail.Headers[sendgrid.HeaderKey] == derive.Key("order-1042", "email.receipt"))
		w.Header().Set("X-Message-Id", "W4p0sWJtRKm5dGxHZ3Yw1A")
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()

	p, err := sendgrid.New(&sendgrid.Config{APIKey: "SG.example", BaseURL: srv.URL})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	r := p.Call(context.Background(), providers.Call{
		EffectID: 1,
		SourceID: "order-1042",
		Kind:     "email.receipt",
		Key:      derive.Key("order-1042", "email.receipt"),
		Payload: json.RawMessage(`{
			"personalizations": [{"to": [{"email": "ada@example.com"}], "custom_args": {"order": "A-1042"}}],
			"from": {"email": "shop@example.com"},
			"subject": "Your receipt",
			"content": [{"type": "text/plain", "value": "Thank you for your order."}]
		}`),
		Attempt: 1,
	})
	fmt.Println(r.Class, r.Ref, p.Idempotent())

	// A payload without recipients is refused before any request.
	r = p.Call(context.Background(), providers.Call{Key: "k", Payload: json.RawMessage(`{"subject": "no recipients"}`)})
	fmt.Println(r.Class, r.Err)
	// Output:
	// custom_args: map[order:A-1042 sidefx_key:sfx1_7b1e9171a05ea978824bc3c75c5e32174f196a049c4075af5b53b480daeb91ca sidefx_kind:email.receipt sidefx_source_id:order-1042]
	// header: true
	// confirmed W4p0sWJtRKm5dGxHZ3Yw1A false
	// rejected sendgrid mail send: invalid sendgrid mail payload: no personalizations: at least one, with a "to" recipient, is required
}
