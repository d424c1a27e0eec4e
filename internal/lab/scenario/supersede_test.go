package scenario

import (
	"strconv"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/derive"
)

// A charge whose card is declined fails, and Stripe keeps the decline under
// its key: `sidefx retry` sends the same payload under the same key and
// meets the stored decline again. `sidefx supersede` with another card sends
// the corrected payload under the revision's key, and the charge is
// confirmed with the peer's reference. The producer's event, replayed with
// the old payload, is a duplicate.
func TestScenario_DeclinedChargeSupersededThenConfirmed(t *testing.T) {
	t.Parallel()
	w := setup(t, Always(Pass))
	w.writeConfig(config{
		dispatcher: "workers: 2, batch_size: 10, lease: 5s, poll_interval: 50ms, rescue_interval: 1s, shutdown_timeout: 5s",
		charge:     "max_attempts: 3, timeout: 2s, backoff_base: 50ms, backoff_max: 100ms",
	})
	const source = "order-s-1"
	declined := `{"amount": 2500, "currency": "usd", "source": "tok_chargeDeclined", "description": "supersede scenario"}`
	// Checked at enqueue and accepted: the parameters are right, the card is not.
	w.mustSidefx("enqueue", "--source", source, "--kind", chargeKind, "--payload", declined)
	d := w.startDaemon()
	first := w.waitTerminal(chargeKind, []string{source})[source]
	if first.State != "failed" || !strings.Contains(first.LastError, "declined") {
		t.Fatalf("a declined card: %v, want failed naming the decline", first)
	}
	id := strconv.FormatInt(first.ID, 10)

	// The same key meets the stored decline again.
	w.mustSidefx("retry", id, "--attempts", "1", "--note", "try again")
	w.waitFor(settleTimeout, "the retry settled", func() (bool, string) {
		r := w.mustRow(source, chargeKind)
		return r.State == "failed" && r.Attempts == 2, r.String()
	})
	if st := w.proxy.Stats(first.Key); st.Received != 2 || st.Performed != 0 {
		t.Fatalf("key %s: %d requests, %d performed; want the decline twice", first.Key, st.Received, st.Performed)
	}

	// A misspelled correction is refused before it is stored.
	if r := w.sidefx("supersede", id, "--payload", `{"amount": 2500, "currency": "usd", "sourse": "tok_visa"}`, "--note", "customer gave another card"); r.code == 0 ||
		!strings.Contains(r.stderr, "sourse") {
		t.Fatalf("a misspelled correction: want a refusal naming it\n%s", r)
	}
	fixed := `{"amount": 2500, "currency": "usd", "source": "tok_visa", "description": "supersede scenario"}`
	res := w.mustSidefx("supersede", id, "--payload", fixed, "--actor", "ops@example", "--note", "customer gave another card")
	newKey := derive.Revision(first.Key, 1)
	if !strings.Contains(res.stdout, "key "+newKey+" replaces "+first.Key) {
		t.Fatalf("supersede did not name the keys:\n%s", res)
	}
	rows := w.waitTerminal(chargeKind, []string{source})
	w.checkConfirmedAtPeer(rows)
	if r := rows[source]; r.Key != newKey {
		t.Fatalf("confirmed under %s, want the revision's key %s", r.Key, newKey)
	}
	if st := w.proxy.Stats(first.Key); st.Received != 2 {
		t.Fatalf("the old key was sent again after the supersession: %d requests", st.Received)
	}
	out := w.mustSidefx("inspect", id).stdout
	for _, want := range []string{"supersede failed → pending by ops@example", "key " + first.Key + " → " + newKey, "customer gave another card"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
	// The producer's event delivered again, with the old payload.
	if r := w.mustSidefx("enqueue", "--source", source, "--kind", chargeKind, "--payload", declined); !strings.Contains(r.stdout, "already present: effect "+id) {
		t.Fatalf("replay of the old payload:\n%s", r)
	}
	d.stop()
}
