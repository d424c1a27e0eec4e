package demo

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/sidefx/sidefx/effects"
)

// collect reads the final states and the providers' counts, and finds out
// why each uncertain receipt is uncertain.
func (d *demo) collect(ctx context.Context) error {
	s, err := d.snapshot(ctx)
	if err != nil {
		return err
	}
	d.sum.States = s.byKind
	for _, k := range Kinds {
		if d.sum.States[k] == nil {
			d.sum.States[k] = map[effects.State]int{}
		}
	}
	d.sum.Stripe, d.sum.Mail, d.sum.Webhook = stripeCounts(d.stripe), mailCounts(d.mail), webhookCounts(d.partner)

	uncertain, err := listAll(ctx, d.store, effects.Filter{States: []effects.State{effects.Uncertain}, Kinds: []string{KindReceipt}})
	if err != nil {
		return err
	}
	// A claim the killed dispatcher had sent may have committed after the
	// kill, when its fired rows were listed: the rescue names the worker it
	// took them from, whose id holds the killed pid. They were in flight too.
	if k := &d.sum.Kill; k.Done && k.InFlight != nil {
		killedWorker := fmt.Sprintf("-%d-", k.PID)
		for _, e := range uncertain {
			if _, ok := k.InFlight[e.ID]; !ok && strings.Contains(e.LastError, "lease expired") && strings.Contains(e.LastError, killedWorker) {
				k.InFlight[e.ID] = InFlight{Kind: e.Kind, SourceID: e.SourceID, Key: e.Key, Attempt: e.Attempts}
			}
		}
	}
	lost := map[string]bool{}
	for _, k := range d.sum.Mail.LostKeys {
		lost[k] = true
	}
	killed := map[string]bool{}
	for _, f := range d.sum.Kill.InFlight {
		killed[f.Key] = true
	}
	for _, e := range uncertain {
		u := UncertainEmail{ID: e.ID, OrderID: e.SourceID, Key: e.Key, Sent: d.sum.Mail.AcceptedPerKey[e.Key], MessageID: d.sum.Mail.MessageIDs[e.Key]}
		switch {
		case killed[e.Key]:
			u.Cause = CauseKilled
		case lost[e.Key]:
			u.Cause = CauseAnswerLost
		default:
			u.Cause = CauseOther
		}
		d.sum.Uncertain = append(d.sum.Uncertain, u)
	}
	return nil
}

func (d *demo) problem(format string, args ...any) {
	d.sum.Problems = append(d.sum.Problems, fmt.Sprintf(format, args...))
}

// check compares the numbers with what sidefx promises.
func (d *demo) check() {
	s, n := d.sum, d.opts.Orders
	p := s.Path
	if p.Orders != n || p.EdgeReplays != p.AnswersDropped {
		d.problem("the API took %d orders (want %d) and replayed %d answers for %d dropped", p.Orders, n, p.EdgeReplays, p.AnswersDropped)
	}
	if p.Published != n || p.PublishReplays != p.AcksLost {
		d.problem("the stream holds %d events (want %d); JetStream absorbed %d duplicate publishes for %d lost acknowledgements", p.Published, n, p.PublishReplays, p.AcksLost)
	}
	if p.Deliveries-p.InboxDuplicates != n || p.InboxDuplicates < d.opts.Replays*n || p.Redeployed != n {
		d.problem("billing handled %d of %d deliveries (want %d; at least %d absorbed by the inbox), billing-v2 got %d", p.Deliveries-p.InboxDuplicates, p.Deliveries, n, d.opts.Replays*n, p.Redeployed)
	}
	if s.Enqueued != 3*n || s.EnqueueDuplicates != 3*n {
		d.problem("enqueued %d effects and absorbed %d duplicates; want %d and %d", s.Enqueued, s.EnqueueDuplicates, 3*n, 3*n)
	}
	if s.Stripe.Created != n || len(s.Stripe.CreatedPerKey) != n {
		d.problem("stripe created %d payment intents for %d keys; want %d", s.Stripe.Created, len(s.Stripe.CreatedPerKey), n)
	}
	if c := s.States[KindCharge][effects.Confirmed]; c != n {
		d.problem("%d charges confirmed; want %d", c, n)
	}
	if s.Webhook.Processed != n || len(s.Webhook.ProcessedPerID) != n || s.States[KindWebhook][effects.Confirmed] != n {
		d.problem("partner processed %d webhooks (%d ids), %d confirmed; want %d", s.Webhook.Processed, len(s.Webhook.ProcessedPerID), s.States[KindWebhook][effects.Confirmed], n)
	}
	if s.Mail.Duplicates != 0 {
		d.problem("the mail API accepted %d second emails; at most once means none", s.Mail.Duplicates)
	}
	if c, u := s.States[KindReceipt][effects.Confirmed], s.States[KindReceipt][effects.Uncertain]; c+u != n {
		d.problem("%d receipts confirmed and %d uncertain; want %d in all", c, u, n)
	}
	failed := 0
	for _, k := range Kinds {
		failed += s.States[k][effects.Failed]
	}
	if failed != 0 {
		d.problem("%d effects failed", failed)
	}
	if s.Stripe.Refused+s.Mail.Refused+s.Webhook.BadSignatures != 0 {
		d.problem("requests refused: %d at stripe, %d at mail, %d bad webhook signatures", s.Stripe.Refused, s.Mail.Refused, s.Webhook.BadSignatures)
	}
	for _, u := range s.Uncertain {
		if u.Cause == CauseAnswerLost && u.Sent != 1 {
			d.problem("uncertain receipt %s lost its answer but was sent %d times", u.OrderID, u.Sent)
		}
	}
}

// report prints the summary table and what it means.
func (d *demo) report() {
	s, n := d.sum, d.opts.Orders
	st := func(kind string, state effects.State) string { return strconv.Itoa(s.States[kind][state]) }
	itoa := strconv.Itoa
	twice := func(m map[string]int) string {
		t := 0
		for _, v := range m {
			t += max(v-1, 0)
		}
		return itoa(t)
	}
	d.n.text("")
	d.n.say("What happened:")
	d.n.text(table("  ", [][]string{
		{"", "charges", "emails", "webhooks"},
		{"effects (one per order and kind)", itoa(n), itoa(n), itoa(n)},
		{"requests the provider received", itoa(s.Stripe.Requests), itoa(s.Mail.Requests), itoa(s.Webhook.Requests)},
		{"performed (created / sent / processed)", itoa(s.Stripe.Created), itoa(s.Mail.Accepted), itoa(s.Webhook.Processed)},
		{"performed twice", twice(s.Stripe.CreatedPerKey), itoa(s.Mail.Duplicates), twice(s.Webhook.ProcessedPerID)},
		{"repeats absorbed by the provider's key", itoa(s.Stripe.Replays), "-", itoa(s.Webhook.Duplicates)},
		{"429s injected (nothing done; retried)", itoa(s.Stripe.Unavailable), itoa(s.Mail.Unavailable), itoa(s.Webhook.Unavailable)},
		{"answers lost (done; outcome unknown)", itoa(s.Stripe.LostAnswers), itoa(s.Mail.LostAnswers), itoa(s.Webhook.LostAnswers)},
		// The rest of the requests: so that the column adds up.
		{"cut short, nothing done (the kill, a refusal)", itoa(s.Stripe.Requests - s.Stripe.Created - s.Stripe.Replays - s.Stripe.Unavailable),
			itoa(s.Mail.Requests - s.Mail.Accepted - s.Mail.Unavailable), itoa(s.Webhook.Requests - s.Webhook.Processed - s.Webhook.Duplicates - s.Webhook.Unavailable)},
		{"confirmed", st(KindCharge, effects.Confirmed), st(KindReceipt, effects.Confirmed), st(KindWebhook, effects.Confirmed)},
		{"uncertain (for an operator)", st(KindCharge, effects.Uncertain), st(KindReceipt, effects.Uncertain), st(KindWebhook, effects.Uncertain)},
		{"failed", st(KindCharge, effects.Failed), st(KindReceipt, effects.Failed), st(KindWebhook, effects.Failed)},
	}, true)...)
	d.n.text("")
	p := s.Path
	d.n.say("Duplicates absorbed, layer by layer, for %d orders:", n)
	d.n.text(table("  ", [][]string{
		{"the API's edge (Idempotency-Key)", itoa(p.EdgeReplays), "retries after a dropped answer, answered from the key's record"},
		{"the broker (Nats-Msg-Id)", itoa(p.PublishReplays), "publishes repeated after a lost acknowledgement"},
		{"billing's inbox (event id)", itoa(p.InboxDuplicates), "redeliveries after a lost ack, found committed"},
		{"the outbox (UNIQUE (source_id, kind))", itoa(s.EnqueueDuplicates), "billing-v2's effects, enqueued again"},
		{"the providers (sidefx's derived keys)", itoa(s.Stripe.Replays + s.Webhook.Duplicates), fmt.Sprintf("%d at Stripe, %d at the partner: repeats after lost answers and the kill", s.Stripe.Replays, s.Webhook.Duplicates)},
	}, false)...)
	d.n.text("",
		fmt.Sprintf("  Orders placed: %d, with %d requests. Cards charged: %d, one per order.", p.Orders, p.Requests, s.Stripe.Created),
		fmt.Sprintf("  Webhooks: %d processed by the partner, %d duplicate deliveries absorbed by its dedupe on webhook-id.", s.Webhook.Processed, s.Webhook.Duplicates),
		fmt.Sprintf("  Emails: %d sent, %d of them twice.", s.Mail.Accepted, s.Mail.Duplicates),
	)
	d.reportUncertain()
	failed := 0
	for _, k := range Kinds {
		failed += s.States[k][effects.Failed]
	}
	d.n.text(fmt.Sprintf("  Failed: %d.", failed))
	if len(s.Problems) > 0 {
		d.n.text("", "  SOMETHING IS WRONG:")
		for _, p := range s.Problems {
			d.n.text("    " + p)
		}
	}
}

func (d *demo) reportUncertain() {
	us := d.sum.Uncertain
	if len(us) == 0 {
		d.n.text("  No email was left uncertain.")
		return
	}
	by := map[string][]UncertainEmail{}
	for _, u := range us {
		by[u.Cause] = append(by[u.Cause], u)
	}
	sent := func(list []UncertainEmail) int {
		k := 0
		for _, u := range list {
			if u.Sent > 0 {
				k++
			}
		}
		return k
	}
	d.n.text(fmt.Sprintf("  %d emails are uncertain, and were not resent: the mail API takes no idempotency key, so the", len(us)),
		"  dispatcher cannot tell whether they went out, and sending again could mean a second email.")
	if l := by[CauseAnswerLost]; len(l) > 0 {
		d.n.text(fmt.Sprintf("    %d: the mail API accepted them and the answer was lost (by its count %d were sent, each once);", len(l), sent(l)))
	}
	if l := by[CauseKilled]; len(l) > 0 {
		d.n.text(fmt.Sprintf("    %d: in flight when the dispatcher was killed (%d had reached the mail API, %d had not);", len(l), sent(l), len(l)-sent(l)))
	}
	if l := by[CauseOther]; len(l) > 0 {
		d.n.text(fmt.Sprintf("    %d: their calls timed out although the demo injected no fault (%d had reached the mail API);", len(l), sent(l)))
	}
	d.n.text("  Reconciliation settles them next. By hand, an operator would look each one up at the provider (the mail",
		"  carries custom_args.sidefx_key and the header X-Sidefx-Key) and settle it with sidefx resolve, e.g.:")
	var examples [][]string
	var withRef, without bool
	for _, u := range us {
		switch {
		case u.Sent > 0 && !withRef:
			withRef = true
			examples = append(examples, []string{fmt.Sprintf("sidefx resolve %d --as confirmed --ref %s --note \"found at the mail API\"", u.ID, u.MessageID), "# " + u.OrderID + ": the mail API has it"})
		case u.Sent == 0 && !without:
			without = true
			examples = append(examples, []string{fmt.Sprintf("sidefx resolve %d --refire --note \"never arrived\"", u.ID), "# " + u.OrderID + ": it never arrived; send it"})
		}
	}
	slices.SortFunc(examples, func(a, b []string) int { return len(b[0]) - len(a[0]) })
	d.n.text(table("    ", examples, false)...)
}

// checkReconcile checks what reconciliation did: nothing left uncertain,
// nothing wrong at Stripe, no email twice.
func (d *demo) checkReconcile() {
	rc := d.sum.Reconcile
	if rc.After != 0 {
		d.problem("%d receipts still uncertain after %d reconciliation rounds", rc.After, rc.Rounds)
	}
	if rc.Extra+rc.Missing+rc.Errors != 0 {
		d.problem("reconciliation found %d extra and %d missing payment intents, and %d errors", rc.Extra, rc.Missing, rc.Errors)
	}
	if rc.MailDuplicates != 0 {
		d.problem("the mail API sent %d emails twice", rc.MailDuplicates)
	}
	if rc.Before > 0 && rc.Settled+rc.Refired < rc.Before {
		d.problem("%d receipts were uncertain, %d settled and %d refired", rc.Before, rc.Settled, rc.Refired)
	}
}
