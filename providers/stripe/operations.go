package stripe

import (
	stripego "github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/stripe/stripecheck"
)

// The metadata keys the provider adds to the objects it creates, so that a
// reconciler can find the object an effect made (Stripe's search API:
// metadata['sidefx_key']:'sfx1_…').
const (
	// MetadataKey holds the effect's idempotency key (Call.Key).
	MetadataKey = "sidefx_key"
	// MetadataSourceID holds the effect's source id (Call.SourceID).
	MetadataSourceID = "sidefx_source_id"
	// MetadataKind holds the effect's kind (Call.Kind).
	MetadataKind = "sidefx_kind"
)

// operation is one Stripe API call an effect can make.
type operation struct {
	// name is its key in operations.
	name string
	// target: the payload's "id" names the object acted on (capture,
	// cancel); it is taken out before the rest is read as parameters.
	target bool
	// metadata: the parameters take metadata, and sidefx's keys are added.
	metadata bool
	// prefix is the id prefix of the object Stripe answers with.
	prefix string
	// params returns a fresh parameter struct.
	params func() stripego.ParamsContainer
	// send makes the call; the object is non-nil whenever stripe-go
	// returned one (also with some errors).
	send func(api *client.API, id string, p stripego.ParamsContainer) (*object, error)
}

// object is what the provider keeps of the object Stripe answered with.
type object struct {
	ID       string
	Object   string
	Status   string
	Amount   *int64
	Currency string
	Livemode *bool
	resp     *stripego.APIResponse
}

var operations = map[string]operation{
	"payment_intents.create": {
		metadata: true, prefix: "pi_",
		params: func() stripego.ParamsContainer { return &stripego.PaymentIntentParams{} },
		send: func(api *client.API, _ string, p stripego.ParamsContainer) (*object, error) {
			return paymentIntent(api.PaymentIntents.New(p.(*stripego.PaymentIntentParams)))
		},
	},
	"payment_intents.capture": {
		target: true, metadata: true, prefix: "pi_",
		params: func() stripego.ParamsContainer { return &stripego.PaymentIntentCaptureParams{} },
		send: func(api *client.API, id string, p stripego.ParamsContainer) (*object, error) {
			return paymentIntent(api.PaymentIntents.Capture(id, p.(*stripego.PaymentIntentCaptureParams)))
		},
	},
	"payment_intents.cancel": {
		// Cancel takes no metadata: the PaymentIntent keeps what its create
		// set. (stripe.PaymentIntentCancelParams has no Metadata of its
		// own; the AddMetadata it inherits from the deprecated
		// stripe.Params would send a parameter Stripe refuses.)
		target: true, prefix: "pi_",
		params: func() stripego.ParamsContainer { return &stripego.PaymentIntentCancelParams{} },
		send: func(api *client.API, id string, p stripego.ParamsContainer) (*object, error) {
			return paymentIntent(api.PaymentIntents.Cancel(id, p.(*stripego.PaymentIntentCancelParams)))
		},
	},
	"charges.create": {
		metadata: true, prefix: "ch_",
		params: func() stripego.ParamsContainer { return &stripego.ChargeParams{} },
		send: func(api *client.API, _ string, p stripego.ParamsContainer) (*object, error) {
			ch, err := api.Charges.New(p.(*stripego.ChargeParams))
			if ch == nil {
				return nil, err
			}
			return &object{ID: ch.ID, Object: ch.Object, Status: string(ch.Status), Amount: &ch.Amount, Currency: string(ch.Currency), Livemode: &ch.Livemode, resp: ch.LastResponse}, err
		},
	},
	"refunds.create": {
		metadata: true, prefix: "re_",
		params: func() stripego.ParamsContainer { return &stripego.RefundParams{} },
		send: func(api *client.API, _ string, p stripego.ParamsContainer) (*object, error) {
			re, err := api.Refunds.New(p.(*stripego.RefundParams))
			if re == nil {
				return nil, err
			}
			return &object{ID: re.ID, Object: re.Object, Status: string(re.Status), Amount: &re.Amount, Currency: string(re.Currency), resp: re.LastResponse}, err
		},
	},
	"customers.create": {
		metadata: true, prefix: "cus_",
		params: func() stripego.ParamsContainer { return &stripego.CustomerParams{} },
		send: func(api *client.API, _ string, p stripego.ParamsContainer) (*object, error) {
			cus, err := api.Customers.New(p.(*stripego.CustomerParams))
			if cus == nil {
				return nil, err
			}
			return &object{ID: cus.ID, Object: cus.Object, Currency: string(cus.Currency), Livemode: &cus.Livemode, resp: cus.LastResponse}, err
		},
	},
	"transfers.create": {
		metadata: true, prefix: "tr_",
		params: func() stripego.ParamsContainer { return &stripego.TransferParams{} },
		send: func(api *client.API, _ string, p stripego.ParamsContainer) (*object, error) {
			tr, err := api.Transfers.New(p.(*stripego.TransferParams))
			if tr == nil {
				return nil, err
			}
			return &object{ID: tr.ID, Object: tr.Object, Amount: &tr.Amount, Currency: string(tr.Currency), Livemode: &tr.Livemode, resp: tr.LastResponse}, err
		},
	},
}

func init() {
	for name, op := range operations {
		op.name = name
		operations[name] = op
	}
}

func paymentIntent(pi *stripego.PaymentIntent, err error) (*object, error) {
	if pi == nil {
		return nil, err
	}
	return &object{ID: pi.ID, Object: pi.Object, Status: string(pi.Status), Amount: &pi.Amount, Currency: string(pi.Currency), Livemode: &pi.Livemode, resp: pi.LastResponse}, err
}

// Operations returns the Stripe operations the provider supports, sorted:
// the values Config.Operations may map a kind to.
func Operations() []string { return stripecheck.Operations() }

// DefaultOperation returns the operation a kind maps to when
// Config.Operations does not name it: the kind's last two dot-separated
// words ("charge.payment_intents.create" → "payment_intents.create"). The
// result may not be a supported operation.
func DefaultOperation(kind string) string { return stripecheck.DefaultOperation(kind) }

// build reads a call's payload into op's parameters, checked by stripecheck
// (whose tables are stripe-go's structs): the target object's id (for
// capture and cancel) and the parameter struct, with the idempotency
// key and, where the object takes it, sidefx's metadata set.
func (op operation) build(c providers.Call) (stripego.ParamsContainer, string, error) {
	id, fields, err := stripecheck.Parse(op.name, c.Payload)
	if err != nil {
		return nil, "", err
	}
	params := op.params()
	if err := decodeParams(fields, params); err != nil {
		return nil, "", err
	}
	if op.metadata {
		m := params.(interface{ AddMetadata(key, value string) })
		m.AddMetadata(MetadataKey, c.Key)
		m.AddMetadata(MetadataSourceID, c.SourceID)
		m.AddMetadata(MetadataKind, c.Kind)
	}
	params.GetParams().SetIdempotencyKey(c.Key)
	return params, id, nil
}
