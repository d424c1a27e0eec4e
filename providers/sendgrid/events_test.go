package sendgrid_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/sendgrid"
)

// SignEvents signs body as SendGrid's Signed Event Webhook does: ECDSA
// P-256 over SHA-256 of the timestamp followed by the body, the signature
// ASN.1 DER in base64.
func signEvents(t *testing.T, key *ecdsa.PrivateKey, body []byte, ts string) http.Header {
	t.Helper()
	h := sha256.Sum256(append([]byte(ts), body...))
	sig, err := ecdsa.SignASN1(rand.Reader, key, h[:])
	if err != nil {
		t.Fatal(err)
	}
	header := http.Header{}
	header.Set("X-Twilio-Email-Event-Webhook-Signature", base64.StdEncoding.EncodeToString(sig))
	header.Set("X-Twilio-Email-Event-Webhook-Timestamp", ts)
	return header
}

func publicKey(t *testing.T, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(der)
}

const eventsBody = `[
 {"email":"ada@example.com","timestamp":1764000000,"event":"processed","sg_event_id":"evt-1","sg_message_id":"msg-abc.filter0001.1.0","sidefx_key":"sfx1_k1","sidefx_source_id":"order-1","sidefx_kind":"email.receipt"},
 {"email":"ada@example.com","timestamp":1764000005,"event":"delivered","sg_event_id":"evt-2","sg_message_id":"msg-abc.filter0001.1.0","sidefx_key":"sfx1_k1","response":"250 OK"},
 {"email":"bob@example.com","timestamp":1764000007,"event":"bounce","sg_event_id":"evt-3","sg_message_id":"msg-def.filter0002.1.0","reason":"550 no such user bob@example.com"}
]`

func TestEvents_VerifiesAndReads(t *testing.T) {
	t.Parallel()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ev, err := sendgrid.NewEvents(publicKey(t, key), nil)
	if err != nil {
		t.Fatal(err)
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	body := []byte(eventsBody)
	got, err := ev.Events(signEvents(t, key, body, ts), body)
	if err != nil || len(got) != 3 {
		t.Fatalf("events %+v, %v", got, err)
	}
	first := got[0]
	if first.ID != "evt-1" || first.Key != "sfx1_k1" || first.Evidence.Verdict != providers.Found || first.Evidence.Ref != "msg-abc" ||
		first.Evidence.Status != "processed" || !first.Evidence.Succeeded || !first.Evidence.At.Equal(time.Unix(1764000000, 0)) {
		t.Errorf("first event %+v", first)
	}
	if got[2].Key != "" || got[2].Evidence.Status != "bounce" {
		t.Errorf("an event without a sidefx key: %+v", got[2])
	}
	for _, e := range got {
		if d := string(e.Evidence.Detail); strings.Contains(d, "@example.com") {
			t.Errorf("the evidence holds an address: %s", d)
		}
	}

	// Refused: a body changed after signing, another key's signature, a
	// signature over another timestamp, no signature.
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tampered := []byte(eventsBody[:len(eventsBody)-2] + `,{"sg_event_id":"evt-forged","event":"delivered","sidefx_key":"sfx1_k2"}]`)
	for name, c := range map[string]struct {
		h http.Header
		b []byte
	}{
		"tampered body": {signEvents(t, key, body, ts), tampered},
		"another key":   {signEvents(t, other, body, ts), body},
		"other timestamp": {func() http.Header {
			h := signEvents(t, key, body, ts)
			h.Set("X-Twilio-Email-Event-Webhook-Timestamp", "1")
			return h
		}(), body},
		"no signature": {http.Header{}, body},
		"garbage": {func() http.Header {
			h := signEvents(t, key, body, ts)
			h.Set("X-Twilio-Email-Event-Webhook-Signature", "%%%")
			return h
		}(), body},
	} {
		if _, err := ev.Events(c.h, c.b); !errors.Is(err, providers.ErrBadSignature) {
			t.Errorf("%s: %v, want ErrBadSignature", name, err)
		}
	}
	// Verified, but not events.
	junk := []byte(`{"not":"an array"}`)
	if _, err := ev.Events(signEvents(t, key, junk, ts), junk); err == nil || errors.Is(err, providers.ErrBadSignature) {
		t.Errorf("a signed body that is not events: %v", err)
	}
}

func TestNewEvents_RefusesWhatIsNotAnECDSAKey(t *testing.T) {
	t.Parallel()
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	der, _ := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	for name, k := range map[string]string{
		"not base64": "%%%",
		"not DER":    base64.StdEncoding.EncodeToString([]byte("hello")),
		"RSA":        base64.StdEncoding.EncodeToString(der),
	} {
		if _, err := sendgrid.NewEvents(k, nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// A delivery verifies only while its signed timestamp is near now: a
// captured one replayed later is refused, with its age and the tolerance.
func TestEvents_RefusesADeliveryOutsideTheTolerance(t *testing.T) {
	t.Parallel()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	ev, err := sendgrid.NewEvents(publicKey(t, key), &sendgrid.EventsConfig{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(eventsBody)
	signedAt := func(at time.Time) http.Header { return signEvents(t, key, body, strconv.FormatInt(at.Unix(), 10)) }
	for _, ago := range []time.Duration{time.Minute, -time.Minute, 5 * time.Minute} {
		if got, err := ev.Events(signedAt(now.Add(-ago)), body); err != nil || len(got) != 3 {
			t.Errorf("signed %s ago: %d events, %v; want them taken", ago, len(got), err)
		}
	}
	for ago, want := range map[time.Duration]string{
		6 * time.Minute:             "signed 6m0s ago, over the tolerance of 5m0s",
		-6 * time.Minute:            "signed 6m0s ahead of this clock, over the tolerance of 5m0s",
		30 * 24 * time.Hour:         "signed 720h0m0s ago",
		5*time.Minute + time.Second: "signed 5m1s ago",
	} {
		_, err := ev.Events(signedAt(now.Add(-ago)), body)
		if !errors.Is(err, providers.ErrBadSignature) || !strings.Contains(err.Error(), want) {
			t.Errorf("signed %s ago: %v, want ErrBadSignature saying %q", ago, err, want)
		}
	}
	// A wider tolerance takes what the default refuses.
	wide, err := sendgrid.NewEvents(publicKey(t, key), &sendgrid.EventsConfig{Tolerance: 10 * time.Minute, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wide.Events(signedAt(now.Add(-6*time.Minute)), body); err != nil {
		t.Errorf("signed 6m ago, tolerance 10m: %v", err)
	}
	if _, err := sendgrid.NewEvents(publicKey(t, key), &sendgrid.EventsConfig{Tolerance: -time.Second}); err == nil {
		t.Errorf("a negative tolerance was taken")
	}
}
