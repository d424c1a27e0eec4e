package scenario

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/peers"
)

// checkConfirmedAtPeer checks that each charge of rows (by source) is
// confirmed with the id of the one charge the peer holds under its key, and
// that the peer performed its key exactly once.
func (w *world) checkConfirmedAtPeer(rows map[string]row) {
	w.t.Helper()
	byKey := w.peerCharges()
	for _, s := range sortedKeys(rows) {
		r := rows[s]
		st := w.proxy.Stats(r.Key)
		held := byKey[r.Key]
		switch {
		case st.Performed != 1 || len(held) != 1:
			w.t.Errorf("%s: the peer performed key %s %d times and holds %d charges for it, want 1 (modes %v, peer statuses %v)",
				s, r.Key, st.Performed, len(held), st.Modes, st.PeerStatuses)
		case r.State != "confirmed":
			w.t.Errorf("%s: %v, want confirmed: the peer holds charge %s for it", s, r, held[0].ID)
		case r.Ref != held[0].ID:
			w.t.Errorf("%s: confirmed with reference %q, but the peer's charge for key %s is %s", s, r.Ref, r.Key, held[0].ID)
		}
	}
}

// No maybe-performed charge can be cancelled. Every answer is lost, so each
// charge is performed at the peer and goes back to pending with attempts ≥ 1.
// `sidefx cancel` (by id and by --source/--kind) must refuse, exit non-zero,
// say it may have been performed, and change nothing; once answers get
// through, each charge ends confirmed with the peer's charge.
func TestScenario_MaybePerformedChargeCannotBeCancelled(t *testing.T) {
	t.Parallel()
	w := setup(t, Always(LoseAnswer))
	w.writeConfig(config{
		dispatcher: "workers: 4, batch_size: 10, lease: 5s, poll_interval: 50ms, rescue_interval: 1s, shutdown_timeout: 5s",
		charge:     "max_attempts: 25, timeout: 2s, backoff_base: 300ms, backoff_max: 600ms",
	})
	sources, _ := w.enqueueCharges("order-a", 3)
	d := w.startDaemon()
	w.waitFor(settleTimeout, "each charge performed at the peer, its answer lost, back to pending", func() (bool, string) {
		var status []string
		ok := true
		for _, s := range sources {
			r := w.mustRow(s, chargeKind)
			st := w.proxy.Stats(r.Key)
			ok = ok && r.State == "pending" && r.Attempts >= 1 && st.Performed == 1 && st.Lost >= 1
			status = append(status, fmt.Sprintf("%s: %v, performed %d, lost %d", s, r, st.Performed, st.Lost))
		}
		return ok, strings.Join(status, "; ")
	})
	// Stop the daemon, so that nothing moves while the operator acts.
	d.stop()
	before := map[string]row{}
	for _, s := range sources {
		r := w.mustRow(s, chargeKind)
		if r.State != "pending" || r.Attempts < 1 {
			t.Fatalf("%s after the daemon stopped: %v, want pending with attempts ≥ 1 (a lost answer is unknown, retried with the same key)", s, r)
		}
		before[s] = r
	}

	for i, s := range sources {
		r := before[s]
		args := []string{"cancel", strconv.FormatInt(r.ID, 10), "--note", "customer changed their mind"}
		if i == len(sources)-1 {
			args = []string{"cancel", "--source", s, "--kind", chargeKind, "--note", "customer changed their mind"}
		}
		res := w.sidefx(args...)
		if res.code == 0 {
			t.Errorf("sidefx cancel of %s, whose charge the peer performed (%v), succeeded: want a refusal\n%s\nthe row: %s", s, r, res, w.rowJSON(s, chargeKind))
		} else if !strings.Contains(res.stderr, "may have been performed") {
			t.Errorf("sidefx cancel of %s refused without saying it may have been performed\n%s", s, res)
		} else {
			t.Logf("refused as it should be (exit %d): %s", res.code, strings.TrimSpace(res.stderr))
		}
		after := w.mustRow(s, chargeKind)
		if after.State != "pending" || after.Attempts != r.Attempts {
			t.Errorf("%s after the refused cancel: %v, want it unchanged: %v", s, after, r)
		}
	}
	if t.Failed() {
		t.FailNow() // a cancelled charge never confirms: nothing more to see
	}

	// Answers get through now: each charge is confirmed with the peer's.
	w.proxy.SetSchedule(Always(Pass))
	w.startDaemon()
	w.checkConfirmedAtPeer(w.waitTerminal(chargeKind, sources))
}

// Every performed charge ends confirmed with its reference: the first two
// answers of each charge are lost after the peer performed it; the retries
// carry the same key, the peer replays its charge, and each effect is
// confirmed with that charge's id.
func TestScenario_LostAnswersEndConfirmedWithTheirReference(t *testing.T) {
	t.Parallel()
	w := setup(t, FirstOfKey(2, LoseAnswer))
	w.writeConfig(config{
		dispatcher: "workers: 4, batch_size: 10, lease: 5s, poll_interval: 50ms, rescue_interval: 1s, shutdown_timeout: 5s",
		charge:     "max_attempts: 10, timeout: 2s, backoff_base: 50ms, backoff_max: 200ms",
	})
	sources, _ := w.enqueueCharges("order-b", 5)
	w.startDaemon()
	rows := w.waitTerminal(chargeKind, sources)
	w.checkConfirmedAtPeer(rows)
	for _, s := range sources {
		r := rows[s]
		st := w.proxy.Stats(r.Key)
		if st.Lost != 2 || st.PeerReplays < 1 || r.Attempts != st.Received {
			t.Errorf("%s: %v; the proxy lost %d answers, the peer replayed %d times, %d requests: want 2 lost, a replay, one request per attempt",
				s, r, st.Lost, st.PeerReplays, st.Received)
		}
	}
}

// A replay after reaping enqueues nothing, and one with another payload is
// refused. Charges are confirmed and reaped (retention 1s); replaying them
// through `sidefx enqueue` reports them already enqueued and sends nothing
// to the provider; a replay with another amount is refused with the payload
// mismatch and exits non-zero.
func TestScenario_ReplayAfterReapingEnqueuesNothing(t *testing.T) {
	t.Parallel()
	w := setup(t, Always(Pass))
	w.writeConfig(config{
		dispatcher: "workers: 4, batch_size: 10, lease: 5s, poll_interval: 50ms, rescue_interval: 1s, shutdown_timeout: 5s, retention: 1s, reap_interval: 200ms",
		charge:     "max_attempts: 5, timeout: 2s, backoff_base: 50ms, backoff_max: 200ms",
	})
	sources, file := w.enqueueCharges("order-c", 3)
	w.startDaemon()
	w.checkConfirmedAtPeer(w.waitTerminal(chargeKind, sources))
	w.waitFor(settleTimeout, "the confirmed charges reaped (sidefx_reaped_total)", func() (bool, string) {
		v, ok := w.metric("sidefx_reaped_total")
		return ok && v >= float64(len(sources)), fmt.Sprintf("sidefx_reaped_total %v (present %t)", v, ok)
	})
	received := map[string]int{}
	for _, s := range sources {
		received[s] = w.proxy.Stats(w.key(s, chargeKind)).Received
	}

	// Another payload for a reaped effect: refused, nothing written.
	res := w.sidefx("enqueue", "--source", sources[1], "--kind", chargeKind, "--payload", charge(99))
	if res.code == 0 || !strings.Contains(res.stderr, "payload") || !strings.Contains(res.stderr, "differs") {
		t.Errorf("a replay of reaped %s with another payload: want a payload mismatch error and a non-zero exit\n%s", sources[1], res)
	} else {
		t.Logf("refused as it should be: %s", strings.TrimSpace(res.stderr))
	}
	// The same payload: already enqueued.
	res = w.sidefx("enqueue", "--source", sources[0], "--kind", chargeKind, "--payload", charge(0))
	if res.code != 0 || !strings.Contains(res.stdout, "already") || strings.Contains(res.stdout, "inserted") {
		t.Errorf("a replay of reaped %s: want it reported already enqueued, nothing inserted\n%s", sources[0], res)
	} else {
		t.Logf("absorbed as it should be: %s", strings.TrimSpace(res.stdout))
	}
	// The whole backfill again.
	res = w.sidefx("enqueue", "--from", file)
	if want := fmt.Sprintf("0 inserted, %d already present, 0 bad lines", len(sources)); res.code != 0 || !strings.Contains(res.stdout, want) {
		t.Errorf("the backfill replayed after reaping: want %q\n%s", want, res)
	}

	// A fresh charge goes through; by the time it is confirmed and nothing
	// of the replayed sources is pending or fired, a replay that had been
	// enqueued would have been sent.
	w.mustSidefx("enqueue", "--source", "order-c-fresh", "--kind", chargeKind, "--payload", charge(7))
	freshKey := w.key("order-c-fresh", chargeKind)
	w.waitFor(settleTimeout, "the fresh charge confirmed and no replayed charge open", func() (bool, string) {
		fresh, ok := w.row("order-c-fresh", chargeKind)
		var n int
		if err := w.pool.QueryRow(t.Context(), `SELECT count(*) FROM side_effects WHERE source_id = ANY($1) AND state IN ('pending', 'fired')`,
			sources).Scan(&n); err != nil {
			t.Fatal(err)
		}
		// The fresh one may be reaped already (retention 1s): gone counts.
		done := (!ok || fresh.State == "confirmed") && w.proxy.Stats(freshKey).Performed == 1 && n == 0
		return done, fmt.Sprintf("fresh %v (present %t), %d replayed charges open", fresh, ok, n)
	})
	for _, s := range sources {
		if got := w.proxy.Stats(w.key(s, chargeKind)).Received; got != received[s] {
			t.Errorf("%s: %d requests reached Stripe after the replay: the replay after reaping was dispatched again", s, got-received[s])
		}
	}
	for key, charges := range w.peerCharges() {
		if len(charges) != 1 {
			t.Errorf("the peer holds %d charges for key %s", len(charges), key)
		}
	}
}

// Stripe 500s end uncertain, each performed once: the first request of each
// charge is performed at the peer, then answered 500, and that 500 is
// stored for the key and replayed to every retry (as Stripe does). After
// its attempts each effect is uncertain — never failed, which reads
// "definitely not performed" — and the peer performed each exactly once.
func TestScenario_Stripe500sEndUncertainPerformedOnce(t *testing.T) {
	t.Parallel()
	w := setup(t, FirstOfKey(1, Stored500))
	w.writeConfig(config{
		dispatcher: "workers: 4, batch_size: 10, lease: 5s, poll_interval: 50ms, rescue_interval: 1s, shutdown_timeout: 5s",
		charge:     "max_attempts: 3, timeout: 2s, backoff_base: 50ms, backoff_max: 100ms",
	})
	sources, _ := w.enqueueCharges("order-d", 4)
	w.startDaemon()
	rows := w.waitTerminal(chargeKind, sources)
	byKey := w.peerCharges()
	for _, s := range sources {
		r := rows[s]
		st := w.proxy.Stats(r.Key)
		if st.Forwarded != 1 || st.Performed != 1 || len(byKey[r.Key]) != 1 {
			t.Errorf("%s: %d requests reached the peer, %d performed, it holds %d charges: want each exactly once (modes %v)",
				s, st.Forwarded, st.Performed, len(byKey[r.Key]), st.Modes)
		}
		if st.Replayed500s < 1 {
			t.Errorf("%s: %v; no retry met the stored 500 (modes %v)", s, r, st.Modes)
		}
		if r.State != "uncertain" {
			t.Errorf("%s: %v after %d stored-500 replays, want uncertain: the peer performed it (charge %s)",
				s, r, st.Replayed500s, chargeIDs(byKey[r.Key]))
		}
	}
}

func chargeIDs(cs []peers.StripeCharge) string {
	ids := make([]string, len(cs))
	for i, c := range cs {
		ids[i] = c.ID
	}
	return strings.Join(ids, ",")
}
