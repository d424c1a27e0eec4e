package stripe

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/sidefx/sidefx/providers"
)

// DefaultConsistencyDelay is Config.ConsistencyDelay's default: how long
// after an object is made a list endpoint is taken to show it. Stripe's
// list endpoints read what was written (its Search API may lag up to an
// hour, which is why lookups list instead of searching); the delay covers
// clock skew and a request still in flight at Stripe.
const DefaultConsistencyDelay = 5 * time.Minute

// DefaultLookupRate is Config.LookupRate's default: list requests per
// second, well under Stripe's read limit (100/s live, 25/s in test mode),
// so that reconciling never starves the dispatcher's calls.
const DefaultLookupRate = 10

// lookupSkew widens a lookup's span before the first fire: the two clocks
// (the database's and Stripe's) may differ.
const lookupSkew = 10 * time.Minute

// listPage is the page size of a listing, Stripe's maximum.
const listPage int64 = 100

// lister lists one object type created in a span, a page at a time.
type lister func(api *client.API, params stripego.ListParams, span *stripego.RangeQueryParams) (page, error)

// page is one page of a listing: its objects, the id of its last (where
// the next page starts), whether more follow, and the answer it was read
// from (nil when none was read), which listProof checks.
type page struct {
	objects []providers.Object
	last    string
	more    bool
	answer  *stripego.APIResponse
}

var listers = map[string]lister{
	"charges": func(api *client.API, lp stripego.ListParams, span *stripego.RangeQueryParams) (page, error) {
		it := api.Charges.List(&stripego.ChargeListParams{ListParams: lp, CreatedRange: span})
		var pg page
		for it.Next() {
			c := it.Charge()
			pg.last = c.ID
			pg.objects = append(pg.objects, object4(c.ID, c.Metadata, string(c.Status), Performed("charge", string(c.Status)), c.Created))
		}
		return pg.read(it.Iter, it.ChargeList().LastResponse), it.Err()
	},
	"payment_intents": func(api *client.API, lp stripego.ListParams, span *stripego.RangeQueryParams) (page, error) {
		it := api.PaymentIntents.List(&stripego.PaymentIntentListParams{ListParams: lp, CreatedRange: span})
		var pg page
		for it.Next() {
			pi := it.PaymentIntent()
			pg.last = pi.ID
			// Created is what the create call did: an intent that needs no
			// more of the caller (succeeded, processing, or authorised for
			// a later capture) performed the effect; one still waiting for
			// a payment method or an action, or canceled, did not.
			pg.objects = append(pg.objects, object4(pi.ID, pi.Metadata, string(pi.Status), Performed("payment_intent", string(pi.Status)), pi.Created))
		}
		return pg.read(it.Iter, it.PaymentIntentList().LastResponse), it.Err()
	},
	"refunds": func(api *client.API, lp stripego.ListParams, span *stripego.RangeQueryParams) (page, error) {
		it := api.Refunds.List(&stripego.RefundListParams{ListParams: lp, CreatedRange: span})
		var pg page
		for it.Next() {
			r := it.Refund()
			pg.last = r.ID
			pg.objects = append(pg.objects, object4(r.ID, r.Metadata, string(r.Status), Performed("refund", string(r.Status)), r.Created))
		}
		return pg.read(it.Iter, it.RefundList().LastResponse), it.Err()
	},
	"customers": func(api *client.API, lp stripego.ListParams, span *stripego.RangeQueryParams) (page, error) {
		it := api.Customers.List(&stripego.CustomerListParams{ListParams: lp, CreatedRange: span})
		var pg page
		for it.Next() {
			c := it.Customer()
			pg.last = c.ID
			pg.objects = append(pg.objects, object4(c.ID, c.Metadata, "created", Performed("customer", ""), c.Created))
		}
		return pg.read(it.Iter, it.CustomerList().LastResponse), it.Err()
	},
	"transfers": func(api *client.API, lp stripego.ListParams, span *stripego.RangeQueryParams) (page, error) {
		it := api.Transfers.List(&stripego.TransferListParams{ListParams: lp, CreatedRange: span})
		var pg page
		for it.Next() {
			t := it.Transfer()
			pg.last = t.ID
			status := "paid"
			if t.Reversed {
				status = "reversed"
			}
			pg.objects = append(pg.objects, object4(t.ID, t.Metadata, status, Performed("transfer", status), t.Created))
		}
		return pg.read(it.Iter, it.TransferList().LastResponse), it.Err()
	},
}

// read completes pg with what it says of the page: whether more follow,
// and the answer it was read from.
func (pg page) read(it *stripego.Iter, answer *stripego.APIResponse) page {
	pg.more = it.Meta() != nil && it.Meta().HasMore
	pg.answer = answer
	return pg
}

func object4(id string, md map[string]string, status string, ok bool, created int64) providers.Object {
	return providers.Object{Ref: id, Key: md[MetadataKey], SourceID: md[MetadataSourceID], Kind: md[MetadataKind],
		Status: status, Succeeded: ok, Created: time.Unix(created, 0).UTC()}
}

var (
	_ providers.Looker     = (*Provider)(nil)
	_ providers.Lister     = (*Provider)(nil)
	_ providers.RefChecker = (*Provider)(nil)
)

// MakesRef reports whether ref names an object of the type kind's
// operation makes or acts on, by Stripe's id prefix: pi_ for the
// PaymentIntent operations, ch_ (or py_) for charges.create, re_ (or
// pyr_) for refunds.create, cus_ for customers.create, tr_ for
// transfers.create. A charge event carrying its PaymentIntent's metadata,
// or a customer whose metadata names a charge's key, settles nothing.
func (p *Provider) MakesRef(kind, ref string) bool {
	op, ok := p.Operation(kind)
	if !ok {
		return false
	}
	o, ok := operations[op]
	if !ok || o.prefix == "" {
		return false
	}
	for _, pre := range append([]string{o.prefix}, otherPrefixes[o.prefix]...) {
		if strings.HasPrefix(ref, pre) && len(ref) > len(pre) {
			return true
		}
	}
	return false
}

// otherPrefixes are the other prefixes of an object type's ids: a charge
// made by a non-card payment method is py_…, its refund pyr_….
var otherPrefixes = map[string][]string{"ch_": {"py_"}, "re_": {"pyr_"}}

// Performed reports whether a Stripe object of type object ("charge",
// "payment_intent", …) in status says the effect that made it was
// performed. The lookup and the events read objects with this one table:
//
//	object          performed                                not performed
//	payment_intent  succeeded, processing, requires_capture  requires_payment_method, requires_confirmation,
//	                                                         requires_action, canceled
//	charge          succeeded, pending                       failed
//	refund          succeeded, pending, requires_action      failed, canceled
//	customer        (always: it exists)
//	transfer        (always: made, even if later reversed)
//
// A PaymentIntent that still waits for its customer (requires_action: 3-D
// Secure) has not taken the payment: the effect is not settled by it, and
// stays uncertain with the evidence until the intent moves on.
func Performed(object, status string) bool {
	switch object {
	case "payment_intent":
		return status == string(stripego.PaymentIntentStatusSucceeded) || status == string(stripego.PaymentIntentStatusProcessing) ||
			status == string(stripego.PaymentIntentStatusRequiresCapture)
	case "charge":
		return status == string(stripego.ChargeStatusSucceeded) || status == string(stripego.ChargeStatusPending)
	case "refund":
		return status == string(stripego.RefundStatusSucceeded) || status == string(stripego.RefundStatusPending) ||
			status == string(stripego.RefundStatusRequiresAction)
	case "customer", "transfer":
		return true
	}
	return false
}

// ErrNotListable is returned by List for a kind whose operation makes no
// object of its own (a capture, a cancel) or none Stripe lists.
var ErrNotListable = errors.New("the kind's Stripe operation has no object to list")

// objects returns the object type a kind's operation creates, if it can be
// listed: "charges" for charges.create.
func (p *Provider) objects(kind string) (string, bool) {
	op, ok := p.Operation(kind)
	if !ok {
		return "", false
	}
	o, ok := operations[op]
	if !ok || o.target || !o.metadata {
		return "", false
	}
	objects := op[:len(op)-len(".create")]
	_, ok = listers[objects]
	return objects, ok
}

// ConsistencyDelay returns Config.ConsistencyDelay.
func (p *Provider) ConsistencyDelay() time.Duration { return p.consistency }

// List calls fn for every object kind's operation made in [from, to) that
// carries a sidefx key (metadata sidefx_key), newest first: Stripe's list
// endpoint for the object (GET /v1/charges…), created[gte] and created[lt]
// set, a page of 100 at a time, at most Config.LookupRate pages a second.
// Objects outside the span are skipped here too, for an endpoint that
// ignores the filter. Every page must be Stripe's own answer: a 200 with
// Content-Type application/json and a Request-Id header, whose body is a
// list object ({"object": "list", "data": […]}, each object with an id).
// Any other page — a proxy's, "{}" from a host a wrong BaseURL points at —
// says nothing of what Stripe holds: List fails with an error wrapping
// providers.ErrNotProven, as it does on Stripe's error answers.
func (p *Provider) List(ctx context.Context, kind string, from, to time.Time, fn func(providers.Object) error) error {
	objects, ok := p.objects(kind)
	if !ok {
		return fmt.Errorf("stripe: list %s: %w", kind, ErrNotListable)
	}
	span := &stripego.RangeQueryParams{GreaterThanOrEqual: from.Unix(), LesserThan: to.Unix() + 1}
	after := ""
	for {
		if err := p.limiter.Wait(ctx); err != nil {
			return fmt.Errorf("stripe: list %s: %w", objects, err)
		}
		size := listPage
		if p.listPage > 0 {
			size = p.listPage
		}
		lp := stripego.ListParams{Context: ctx, Limit: stripego.Int64(size), Single: true}
		if after != "" {
			lp.StartingAfter = stripego.String(after)
		}
		pg, err := listers[objects](p.api, lp, span)
		if err != nil && pg.answer == nil {
			// No answer read (a transport error), or Stripe's error
			// object or a page without one on a status of 400 or more:
			// stripe-go keeps no answer on the list then.
			return fmt.Errorf("stripe: list %s: %s", objects, p.redact.String(err.Error()))
		}
		// A page says what Stripe holds only if it is Stripe's own: an
		// intermediary's page, or "{}" from a wrong host, read as an empty
		// list would make an effect Stripe performed absent.
		if why := listProof(pg.answer); why != "" {
			return providers.NotProvenError("stripe: list "+objects, pg.answer.StatusCode, p.redact.String(why))
		}
		if err != nil {
			return fmt.Errorf("stripe: list %s: %s", objects, p.redact.String(err.Error()))
		}
		for _, o := range pg.objects {
			if o.Key == "" || o.Created.Before(from.Truncate(time.Second)) || !o.Created.Before(to) {
				continue
			}
			if err := fn(o); err != nil {
				return err
			}
		}
		if !pg.more || pg.last == "" {
			return nil
		}
		after = pg.last
	}
}

// errFound stops a lookup's listing at the object it looked for.
var errFound = errors.New("found")

// Lookup lists the objects kind's operation made since q.FirstFiredAt (less
// a skew) and finds the one whose metadata sidefx_key is q.Key: Found, with
// its id and status. None: Absent once ConsistencyDelay has passed since
// the latest attempt (q.Latest()) by the database's clock (q.Now, else
// Config.Now), NotKnown before. A kind whose operation cannot be listed
// is NotKnown, with no error. A listing that fails — a page not proven
// Stripe's (List), an error answer, a transport error — is NotKnown with
// the error: never Absent.
func (p *Provider) Lookup(ctx context.Context, q providers.Query) (providers.Evidence, error) {
	objects, ok := p.objects(q.Kind)
	if !ok {
		return providers.Evidence{Verdict: providers.NotKnown, Source: "stripe: the kind's operation cannot be listed"}, nil
	}
	source := "stripe list /v1/" + objects
	// The time since the latest attempt by the clock that wrote it (the
	// database's, q.Now); the span listed up to the later of the two
	// clocks, so that neither cuts off an object made since.
	local, now := p.now(), q.Now
	if now.IsZero() {
		now = local
	}
	var found providers.Object
	err := p.List(ctx, q.Kind, q.FirstFiredAt.Add(-lookupSkew), later(now, local).Add(time.Minute), func(o providers.Object) error {
		if o.Key == q.Key {
			found = o
			return errFound
		}
		return nil
	})
	switch {
	case errors.Is(err, errFound):
		return providers.Evidence{Verdict: providers.Found, Ref: found.Ref, Succeeded: found.Succeeded, Status: found.Status,
			At: found.Created, Source: source}, nil
	case err != nil:
		return providers.Evidence{Verdict: providers.NotKnown, Source: source}, err
	case now.Sub(q.Latest()) < p.consistency:
		return providers.Evidence{Verdict: providers.NotKnown, Source: source + ": too early to say absent"}, nil
	}
	return providers.Evidence{Verdict: providers.Absent, Source: source}, nil
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
