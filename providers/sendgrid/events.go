package sendgrid

import (
	"cmp"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sendgrid/sendgrid-go/helpers/eventwebhook"

	"github.com/sidefx/sidefx/providers"
)

// Events is SendGrid's Signed Event Webhook, verified: each delivery is a
// JSON array of events, signed with ECDSA (P-256, SHA-256) over the
// timestamp header followed by the body, with the account's key, whose
// public half SendGrid's settings show (base64 DER). The verification is
// sendgrid-go's own (helpers/eventwebhook). A delivery whose signed
// timestamp is further from now than EventsConfig.Tolerance (default 5
// minutes, as Stripe's webhooks) is refused too: the signature covers the
// timestamp, so a delivery captured on its way verifies forever, and the
// tolerance bounds how long it can be replayed.
//
// An event carrying the custom argument sidefx_key (every mail the
// provider sends carries it) is evidence that SendGrid accepted the effect's
// mail: processed, deferred, delivered, bounce, dropped, open and click all
// follow an accepted request. Its reference is the X-Message-Id the send was
// answered with (sg_message_id up to its first dot), its status the event.
type Events struct {
	key       *ecdsa.PublicKey
	tolerance time.Duration
	now       func() time.Time
}

var _ providers.EventSource = (*Events)(nil)

// DefaultEventTolerance is the default of EventsConfig.Tolerance: as
// Stripe's webhook signatures (stripe-go's webhook.DefaultTolerance).
const DefaultEventTolerance = 5 * time.Minute

// EventsConfig configures Events.
type EventsConfig struct {
	// Tolerance is how far a delivery's signed timestamp may be from now,
	// in the past or the future (clocks differ), for the delivery to be
	// taken. Default DefaultEventTolerance, 5 minutes.
	Tolerance time.Duration
	// Now is the clock the timestamp is compared with. Default time.Now.
	Now func() time.Time
}

// NewEvents returns the verifier for the public key (base64 DER of an
// ECDSA P-256 key, as SendGrid shows it). cfg may be nil: the defaults.
func NewEvents(publicKey string, cfg *EventsConfig) (*Events, error) {
	var c EventsConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Tolerance < 0 {
		return nil, errors.New("sendgrid: the event webhook's tolerance must not be negative")
	}
	der, err := base64.StdEncoding.DecodeString(strings.TrimSpace(publicKey))
	if err != nil {
		return nil, fmt.Errorf("sendgrid: the event webhook's public key is not base64: %w", err)
	}
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("sendgrid: the event webhook's public key is not a DER public key: %w", err)
	}
	key, ok := pub.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("sendgrid: the event webhook's public key is a %T, not an ECDSA key", pub)
	}
	e := &Events{key: key, tolerance: cmp.Or(c.Tolerance, DefaultEventTolerance), now: c.Now}
	if e.now == nil {
		e.now = time.Now
	}
	return e, nil
}

// event is what is read of one SendGrid event.
type event struct {
	EventID   string `json:"sg_event_id"`
	MessageID string `json:"sg_message_id"`
	Event     string `json:"event"`
	Timestamp int64  `json:"timestamp"`
	Key       string `json:"sidefx_key"`
	SourceID  string `json:"sidefx_source_id"`
	Kind      string `json:"sidefx_kind"`
}

// Events verifies a delivery and returns its events (those without a
// sidefx key too, with Key empty).
func (e *Events) Events(header http.Header, body []byte) ([]providers.Event, error) {
	sig, ts := header.Get(eventwebhook.VerificationHTTPHeader), header.Get(eventwebhook.TimestampHTTPHeader)
	if sig == "" || ts == "" {
		return nil, fmt.Errorf("sendgrid events: no %s or %s header: %w", eventwebhook.VerificationHTTPHeader, eventwebhook.TimestampHTTPHeader, providers.ErrBadSignature)
	}
	ok, err := eventwebhook.VerifySignature(e.key, body, sig, ts)
	if err != nil || !ok {
		return nil, fmt.Errorf("sendgrid events: %w", providers.ErrBadSignature)
	}
	secs, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("sendgrid events: the %s header is not unix seconds: %w", eventwebhook.TimestampHTTPHeader, providers.ErrBadSignature)
	}
	switch age := e.now().Sub(time.Unix(secs, 0)); {
	case age > e.tolerance:
		return nil, fmt.Errorf("sendgrid events: the delivery was signed %s ago, over the tolerance of %s: %w", age.Truncate(time.Second), e.tolerance, providers.ErrBadSignature)
	case age < -e.tolerance:
		return nil, fmt.Errorf("sendgrid events: the delivery was signed %s ahead of this clock, over the tolerance of %s: %w", (-age).Truncate(time.Second), e.tolerance, providers.ErrBadSignature)
	}
	var evs []event
	if err := json.Unmarshal(body, &evs); err != nil {
		return nil, fmt.Errorf("sendgrid events: the body is not a JSON array of events: %w", err)
	}
	out := make([]providers.Event, 0, len(evs))
	for i, ev := range evs {
		if ev.EventID == "" {
			return nil, fmt.Errorf("sendgrid events: event %d has no sg_event_id", i)
		}
		ref, _, _ := strings.Cut(ev.MessageID, ".")
		// No address and no reason (a bounce's names the address): no
		// personal data in the evidence.
		detail, _ := json.Marshal(map[string]string{"event": ev.Event, "sg_message_id": ev.MessageID})
		var at time.Time
		if ev.Timestamp > 0 {
			at = time.Unix(ev.Timestamp, 0).UTC()
		}
		out = append(out, providers.Event{ID: ev.EventID, Key: ev.Key, Evidence: providers.Evidence{
			Verdict: providers.Found, Ref: ref, Succeeded: true, Status: ev.Event, At: at,
			Source: "sendgrid event webhook", Detail: detail,
		}})
	}
	return out, nil
}
