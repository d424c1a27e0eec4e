package demo

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// fault is what a local provider does to the first request it gets for a
// key.
type fault int

const (
	faultNone        fault = iota
	faultUnavailable       // 429 before doing anything: a definite "not done"
	faultLostAnswer        // done, then no answer until the client gives up
)

// plan decides, from the seed alone, which first requests get a fault and
// how long each request takes: the same seed gives the same faults.
type plan struct {
	seed        uint64
	timeoutRate float64
	errorRate   float64
}

// unit returns a number in [0, 1) fixed by the seed and the parts.
func (p plan) unit(parts ...string) float64 {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], p.seed)
	h.Write(b[:])
	for _, s := range parts {
		binary.BigEndian.PutUint64(b[:], uint64(len(s)))
		h.Write(b[:])
		h.Write([]byte(s))
	}
	return float64(binary.BigEndian.Uint64(h.Sum(nil))>>11) / (1 << 53)
}

// first returns the fault of the first request for key at server.
func (p plan) first(server, key string) fault {
	u := p.unit("fault", server, key)
	switch {
	case u < p.errorRate:
		return faultUnavailable
	case u < p.errorRate+p.timeoutRate:
		return faultLostAnswer
	}
	return faultNone
}

// latency returns how long request n for key at server takes: between lo
// and hi.
func (p plan) latency(server, key string, n int, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(p.unit("latency", server, key, strconv.Itoa(n))*float64(hi-lo))
}

// The local providers' latencies: each request takes between lo and hi.
const (
	stripeLo, stripeHi   = 40 * time.Millisecond, 120 * time.Millisecond
	mailLo, mailHi       = 20 * time.Millisecond, 60 * time.Millisecond
	partnerLo, partnerHi = 10 * time.Millisecond, 40 * time.Millisecond
)

// faults returns the fault plan of a local provider: every request takes
// the plan's latency; the first for a key gets the plan's fault.
func (p plan) faults(server string, lo, hi time.Duration) func(providers.Call, int) providertest.Fault {
	return func(c providers.Call, n int) providertest.Fault {
		f := providertest.Latency(p.latency(server, c.Key, n-1, lo, hi))
		if n == 1 {
			switch p.first(server, c.Key) {
			case faultUnavailable:
				f.Kind = providertest.KindRateLimited
			case faultLostAnswer:
				f.Kind = providertest.KindPerformedThenTimeout
			}
		}
		return f
	}
}

// The local providers are providertest's fakes behind their vendors' wire
// formats: the same fakes and servers the tests and benchmarks use.

// startStripe starts the demo's Stripe: idempotent per Idempotency-Key, as
// Stripe is.
func startStripe(apiKey string, p plan) *providertest.WireServer {
	return providertest.NewStripeServer(providertest.New(providertest.Config{Name: "stripe", Idempotent: true,
		Faults: p.faults("stripe", stripeLo, stripeHi)}), apiKey)
}

// startMail starts the demo's SendGrid: no idempotency key, as SendGrid
// has none; a repeat is a second email.
func startMail(apiKey string, p plan) *providertest.WireServer {
	return providertest.NewMailServer(providertest.New(providertest.Config{Name: "mail",
		Faults: p.faults("mail", mailLo, mailHi)}), apiKey)
}

// receiverPath is where the partner's receiver is called.
const receiverPath = "/hooks/orders"

// startReceiver starts the partner's Standard Webhooks receiver, which
// dedupes on webhook-id as the specification tells receivers to.
func startReceiver(secret string, p plan) (*providertest.WireServer, error) {
	return providertest.NewWebhookReceiver(providertest.New(providertest.Config{Name: "partner", Idempotent: true,
		Faults: p.faults("partner", partnerLo, partnerHi)}), secret)
}

// StripeCounts is what the local Stripe saw and did.
type StripeCounts struct {
	// Requests counts the requests received.
	Requests int
	// Created counts the payment intents created: charges performed.
	Created int
	// Replays counts requests answered with the stored answer of an
	// earlier request with the same Idempotency-Key, performing nothing.
	Replays int
	// Unavailable counts the 429s injected, before performing anything.
	Unavailable int
	// LostAnswers counts the payment intents created whose answer was then
	// lost: the connection dropped before it.
	LostAnswers int
	// Refused counts requests refused for a wrong API key or no
	// Idempotency-Key; a correct run has none.
	Refused int
	// CreatedPerKey counts the payment intents created per
	// Idempotency-Key; Stripe's promise is that none exceeds 1.
	CreatedPerKey map[string]int
}

// MailCounts is what the local mail API saw and did.
type MailCounts struct {
	// Requests counts the requests received.
	Requests int
	// Accepted counts the messages accepted (202): emails sent.
	Accepted int
	// Duplicates counts messages accepted for a sidefx key already
	// accepted once: second emails. At most once means none.
	Duplicates int
	// Unavailable counts the 429s injected, before accepting anything.
	Unavailable int
	// LostAnswers counts the messages accepted whose answer was then lost.
	LostAnswers int
	// Refused counts requests refused for a wrong API key or a body
	// without the sidefx key; a correct run has none.
	Refused int
	// AcceptedPerKey counts the messages accepted per sidefx key
	// (personalizations[].custom_args.sidefx_key).
	AcceptedPerKey map[string]int
	// LostKeys are the keys of the messages counted in LostAnswers.
	LostKeys []string
	// MessageIDs maps each accepted key to the X-Message-Id it got.
	MessageIDs map[string]string
}

// WebhookCounts is what the local webhook receiver saw and did.
type WebhookCounts struct {
	// Requests counts the requests received.
	Requests int
	// Processed counts the deliveries processed: distinct webhook-ids.
	Processed int
	// Duplicates counts deliveries of a webhook-id already processed,
	// answered 2xx without processing again: duplicates absorbed.
	Duplicates int
	// Unavailable counts the 429s injected, before processing anything.
	Unavailable int
	// LostAnswers counts the deliveries processed whose answer was then
	// lost.
	LostAnswers int
	// BadSignatures counts deliveries that failed Standard Webhooks
	// verification; a correct run has none.
	BadSignatures int
	// ProcessedPerID counts the times each webhook-id was processed; the
	// receiver's dedupe keeps each at 1.
	ProcessedPerID map[string]int
}

// tally is what a fake's call records add up to.
type tally struct {
	requests, performed, replays, unavailable, lost, duplicates int
	performedPerKey                                             map[string]int
	lostKeys                                                    []string
	refs                                                        map[string]string // key → the ref of its last performance
}

func tallyOf(s *providertest.WireServer) tally {
	t := tally{requests: s.Refused(), performedPerKey: map[string]int{}, refs: map[string]string{}}
	for _, r := range s.Fake().AllCalls() {
		t.requests++
		switch {
		case r.Replayed:
			t.replays++
		case r.Performed:
			t.performed++
			t.performedPerKey[r.Key]++
			if t.performedPerKey[r.Key] > 1 {
				t.duplicates++
			}
			t.refs[r.Key] = r.Ref
		case r.Fault.Kind == providertest.KindRateLimited:
			t.unavailable++
		}
		if r.Performed && r.Fault.Kind == providertest.KindPerformedThenTimeout {
			t.lost++
			t.lostKeys = append(t.lostKeys, r.Key)
		}
	}
	return t
}

func stripeCounts(s *providertest.WireServer) StripeCounts {
	t := tallyOf(s)
	return StripeCounts{Requests: t.requests, Created: t.performed, Replays: t.replays, Unavailable: t.unavailable,
		LostAnswers: t.lost, Refused: s.Refused(), CreatedPerKey: t.performedPerKey}
}

func mailCounts(s *providertest.WireServer) MailCounts {
	t := tallyOf(s)
	ids := map[string]string{}
	for k, ref := range t.refs {
		ids[k] = "msg_" + ref
	}
	return MailCounts{Requests: t.requests, Accepted: t.performed, Duplicates: t.duplicates, Unavailable: t.unavailable,
		LostAnswers: t.lost, Refused: s.Refused(), AcceptedPerKey: t.performedPerKey, LostKeys: t.lostKeys, MessageIDs: ids}
}

func webhookCounts(s *providertest.WireServer) WebhookCounts {
	t := tallyOf(s)
	return WebhookCounts{Requests: t.requests, Processed: t.performed, Duplicates: t.replays, Unavailable: t.unavailable,
		LostAnswers: t.lost, BadSignatures: s.Refused(), ProcessedPerID: t.performedPerKey}
}
