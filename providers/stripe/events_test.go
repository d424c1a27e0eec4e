package stripe_test

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe"
)

const whsec = "whsec_test_endpoint_secret_0123456789"

// sign signs body as Stripe signs a webhook delivery (stripe-go's
// ComputeSignature): "t=<unix>,v1=<hex HMAC-SHA256>".
func sign(body []byte, at time.Time, secret string) http.Header {
	h := http.Header{}
	h.Set("Stripe-Signature", fmt.Sprintf("t=%d,v1=%s", at.Unix(), hex.EncodeToString(webhook.ComputeSignature(at, body, secret))))
	return h
}

const chargeSucceeded = `{"id":"evt_1","object":"event","api_version":"2020-08-27","type":"charge.succeeded","created":1764000000,
 "data":{"object":{"id":"ch_1","object":"charge","status":"succeeded","created":1764000000,"amount":1200,
  "metadata":{"sidefx_key":"sfx1_k1","sidefx_source_id":"order-1","sidefx_kind":"charge.create"}}}}`

func TestEvents_VerifiesAndReads(t *testing.T) {
	t.Parallel()
	ev, err := stripe.NewEvents(whsec)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(chargeSucceeded)
	got, err := ev.Events(sign(body, time.Now(), whsec), body)
	if err != nil || len(got) != 1 {
		t.Fatalf("events %+v, %v", got, err)
	}
	e := got[0]
	if e.ID != "evt_1" || e.Key != "sfx1_k1" || e.Evidence.Ref != "ch_1" || e.Evidence.Status != "succeeded" || !e.Evidence.Succeeded ||
		e.Evidence.Verdict != providers.Found || !e.Evidence.At.Equal(time.Unix(1764000000, 0)) {
		t.Errorf("event %+v", e)
	}
	failed := []byte(`{"id":"evt_2","object":"event","type":"charge.failed","data":{"object":{"id":"ch_2","object":"charge","status":"failed","metadata":{"sidefx_key":"sfx1_k2"}}}}`)
	if got, err := ev.Events(sign(failed, time.Now(), whsec), failed); err != nil || got[0].Evidence.Succeeded || got[0].Key != "sfx1_k2" {
		t.Errorf("a failed charge: %+v, %v", got, err)
	}
	for name, c := range map[string]struct {
		h http.Header
		b []byte
	}{
		"tampered body":  {sign(body, time.Now(), whsec), []byte(chargeSucceeded[:len(chargeSucceeded)-1] + ` `)},
		"another secret": {sign(body, time.Now(), "whsec_another"), body},
		"too old":        {sign(body, time.Now().Add(-time.Hour), whsec), body},
		"no signature":   {http.Header{}, body},
	} {
		if _, err := ev.Events(c.h, c.b); !errors.Is(err, providers.ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
	if _, err := stripe.NewEvents("sk_live_not_a_webhook_secret"); err == nil {
		t.Error("a secret without whsec_ was accepted")
	}
}

// Only the platform account's own events of the API key's mode are
// evidence: a connected account's event (a Connect endpoint delivers them
// signed with the same secret) names that account's object, with metadata
// it chose (sidefx keys are computable), and an event of the other mode
// the other mode's object. Both come back without a key, so the daemon
// stores neither.
func TestEvents_OnlyThePlatformsOwnOfItsMode(t *testing.T) {
	t.Parallel()
	src, err := stripe.NewEvents(whsec)
	if err != nil {
		t.Fatal(err)
	}
	const pi = `{"id":"evt_%d","object":"event","type":"payment_intent.succeeded","created":1764000000%s,
	 "data":{"object":{"id":"pi_%d","object":"payment_intent","status":"succeeded","created":1764000000,
	  "metadata":{"sidefx_key":"sfx1_victim"}}}}`
	for i, c := range []struct {
		events *stripe.Events
		extra  string
		ours   bool
	}{
		{src, ``, true},
		{src, `,"account":"acct_attacker"`, false},
		{src.ForMode(true), `,"livemode":false`, false},
		{src.ForMode(false), `,"livemode":false`, true},
		{src.ForMode(false), `,"livemode":true`, false},
	} {
		body := []byte(fmt.Sprintf(pi, i, c.extra, i))
		got, err := c.events.Events(sign(body, time.Now(), whsec), body)
		if err != nil || len(got) != 1 {
			t.Fatalf("case %d: %+v, %v", i, got, err)
		}
		if ours := got[0].Key != ""; ours != c.ours {
			t.Errorf("case %d (%s): taken as evidence %t, want %t", i, c.extra, ours, c.ours)
		}
	}
}
