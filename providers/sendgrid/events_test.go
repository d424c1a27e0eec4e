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
	ev, err := sendgrid.NewEvents(publicKey(t, key))
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
		if _, err := sendgrid.NewEvents(k); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
