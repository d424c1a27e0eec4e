package stripe

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/sidefx/sidefx/providers"
)

// Events is a Stripe webhook endpoint's deliveries, verified with
// stripe-go's webhook package: the Stripe-Signature header, an HMAC-SHA256
// of the timestamp and the body with the endpoint's signing secret
// (whsec_…), within webhook.DefaultTolerance (5 minutes) of now.
//
// Only the platform account's own events count: one carrying "account"
// (from a connected account, on a Connect endpoint) or of the other mode
// (ForMode) is returned without a key, and so never stored as evidence.
//
// An event whose object carries sidefx's metadata (charge.succeeded,
// payment_intent.succeeded, refund.created, customer.created, … for the
// objects the provider creates) is evidence that Stripe made the object:
// its id is the reference, its status the object's, performed as the
// lookup reads the same object (Performed's table). Which effects it may
// settle is the reconciler's check: only those of the kinds this
// provider serves, and only with an object of the type their operation
// makes (MakesRef).
type Events struct {
	secret string
	mode   *bool // the livemode events must have; nil: either
}

// ForMode returns a copy of e that takes only events of the given mode
// (livemode true: live): an event of the other mode speaks of another
// world's objects. The daemon sets it from the provider's API key.
func (e *Events) ForMode(live bool) *Events {
	c := *e
	c.mode = &live
	return &c
}

var _ providers.EventSource = (*Events)(nil)

// NewEvents returns the verifier for an endpoint's signing secret.
func NewEvents(secret string) (*Events, error) {
	if !strings.HasPrefix(secret, "whsec_") || strings.TrimSpace(secret) != secret {
		// The secret itself is not quoted.
		return nil, errors.New("stripe: the webhook signing secret does not start with whsec_ (Dashboard → Developers → Webhooks → the endpoint → Signing secret)")
	}
	return &Events{secret: secret}, nil
}

// Events verifies a delivery and returns its event (with Key empty when
// its object carries no sidefx key, or it has no object).
func (e *Events) Events(header http.Header, body []byte) ([]providers.Event, error) {
	if err := webhook.ValidatePayload(body, header.Get("Stripe-Signature"), e.secret); err != nil {
		return nil, fmt.Errorf("stripe events: %v: %w", err, providers.ErrBadSignature)
	}
	var ev stripego.Event
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID == "" {
		return nil, fmt.Errorf("stripe events: the body is not a Stripe event: %v", err)
	}
	out := providers.Event{ID: ev.ID}
	if ev.Data == nil || len(ev.Data.Raw) == 0 {
		return []providers.Event{out}, nil
	}
	if ev.Account != "" || (e.mode != nil && ev.Livemode != *e.mode) {
		// A connected account's event (a Connect endpoint delivers them
		// signed with the same secret) is about that account's objects,
		// with metadata it chose, and an event of the other mode about
		// the other mode's: neither is evidence for sidefx's effects,
		// which this provider makes in the platform's own account.
		return []providers.Event{out}, nil
	}
	var obj struct {
		ID       string            `json:"id"`
		Object   string            `json:"object"`
		Status   string            `json:"status"`
		Created  int64             `json:"created"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := json.Unmarshal(ev.Data.Raw, &obj); err != nil {
		return nil, fmt.Errorf("stripe events: event %s: its object: %v", ev.ID, err)
	}
	status := obj.Status
	if status == "" {
		status = string(ev.Type)
	}
	detail, _ := json.Marshal(map[string]string{"event": string(ev.Type), "object": obj.Object})
	out.Key = obj.Metadata[MetadataKey]
	out.Evidence = providers.Evidence{Verdict: providers.Found, Ref: obj.ID, Succeeded: Performed(obj.Object, obj.Status), Status: status,
		Source: "stripe webhook " + string(ev.Type), Detail: detail}
	if obj.Created > 0 {
		out.Evidence.At = time.Unix(obj.Created, 0).UTC()
	}
	return []providers.Event{out}, nil
}
