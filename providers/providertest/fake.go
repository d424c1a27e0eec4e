package providertest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sidefx/sidefx/providers"
)

// Config configures a Fake. The zero Config is a non-idempotent provider
// named "fake" that confirms every call at once.
type Config struct {
	// Name is what Name returns. Default "fake".
	Name string
	// Idempotent makes the fake honour idempotency keys, like Stripe: the
	// first call performed for a key stores its answer, and every later call
	// with the key replays it (Confirmed, Replayed, the same Ref) without
	// performing again — inside KeyWindow. When false (the default), like
	// SendGrid's mail send, every call that gets as far as performing
	// performs again: a duplicate.
	Idempotent bool
	// KeyWindow is how long an idempotent fake remembers a key, counted on
	// Now from the call that stored the key's answer, like Stripe's 24
	// hours: a call with the key at or after the end of the window is a new
	// request, which performs again and counts as a performance (and a
	// duplicate). KeyWindow is what the fake's KeyWindow method returns, so
	// providers.KeyWindow reports it to the dispatcher. Default 0: keys are
	// remembered forever (see also Forget).
	KeyWindow time.Duration
	// Now is the fake's clock: it stamps CallRecord.At and measures
	// KeyWindow. Inject one to move time past a window without sleeping.
	// It is called with the fake's lock held and must not call the fake.
	// Default time.Now.
	Now func() time.Time
	// Latency delays every call, replays included, before anything else
	// happens. If the call's context ends first, the call returns Unknown
	// and performs nothing. Default 0: no delay.
	Latency time.Duration
	// Faults, if set, is asked before each call which fault to inject; n is
	// the 1-based number of calls made so far for c.Key, this one included.
	// It is called without the fake's lock held, concurrently, and must be
	// safe for that (every plan in this package is). Default nil: no faults.
	Faults func(c providers.Call, n int) Fault
	// MaxRecords caps the CallRecords kept for Calls and AllCalls, so a long
	// benchmark does not grow without bound: calls past the cap are counted
	// (Stats, Performed, replays) but not recorded. Default 0: no cap.
	MaxRecords int
}

// CallRecord is what a Fake remembers of one call.
type CallRecord struct {
	Key      string
	EffectID int64
	Attempt  int
	// N is the call's number among the calls for Key, from 1: the n the
	// fault plan saw.
	N int
	// At is when the fake received the call, on Config.Now.
	At time.Time
	// Fault is the fault applied: the one the plan gave, except that a
	// replay keeps only its Latency and a KindPerformedThenTimeout (see
	// Fault).
	Fault Fault
	// Class is the class of the answer; zero while the call is in flight.
	Class providers.Class
	// Performed: this call performed the effect.
	Performed bool
	// Replayed: this call was answered from an earlier call's performance.
	Replayed bool
	// Ref is the reference of the performance the call made or replayed.
	Ref string
	// Expired: the fake had performed the key before but no longer
	// remembered it (past Config.KeyWindow, or after Forget), so the call
	// was answered as a new request.
	Expired bool
}

// Stats are a Fake's totals since New or the last Reset.
type Stats struct {
	// Calls counts the calls received.
	Calls int
	// InFlight counts the calls received and not yet answered. It is not
	// cleared by Reset: a call in flight during Reset stays in it until it
	// returns.
	InFlight int
	// Performed counts the times an effect was performed, duplicates
	// included.
	Performed int
	// Replays counts the calls answered from an earlier performance
	// (idempotent mode): duplicates absorbed by the key.
	Replays int
	// Duplicates counts performances beyond the first for their key: the
	// sum over keys of performed-1. At an idempotent fake it stays 0 unless
	// a key is repeated after its window (or after Forget).
	Duplicates int
	// Expired counts the calls that found their key performed before but
	// no longer remembered (past Config.KeyWindow, or after Forget).
	Expired int
	// Keys counts the distinct keys performed at least once.
	Keys int
	// Confirmed, Rejected, Retryable and Unknown count the answered calls by
	// class.
	Confirmed, Rejected, Retryable, Unknown int
}

// String formats s for test failures.
func (s Stats) String() string {
	return fmt.Sprintf("calls=%d in_flight=%d performed=%d replays=%d duplicates=%d expired=%d keys=%d confirmed=%d rejected=%d retryable=%d unknown=%d",
		s.Calls, s.InFlight, s.Performed, s.Replays, s.Duplicates, s.Expired, s.Keys,
		s.Confirmed, s.Rejected, s.Retryable, s.Unknown)
}

// Fake is an in-process provider that records every call, counts what it
// performs per key and injects faults. Its methods are safe for concurrent
// use. Build one with New.
type Fake struct {
	name       string
	idempotent bool
	window     time.Duration
	now        func() time.Time
	latency    time.Duration
	faults     func(providers.Call, int) Fault
	maxRecords int

	mu       sync.Mutex
	gen      uint64 // bumped by Reset, so calls that straddle it leave the new state alone
	keys     map[string]*keyState
	records  [][]CallRecord // chunks of recordChunk, so growing never copies
	nrec     int            // records in use
	stats    Stats          // without InFlight
	inFlight int
	refSeq   int64         // numbers refs; not reset, so refs stay unique
	changed  chan struct{} // closed on the next change; nil when nobody waits
}

// keyState is what a Fake knows about one key.
type keyState struct {
	calls     int
	performed int
	// The answer an idempotent fake stored for the key, replayed to later
	// calls while it is remembered.
	saved     bool
	everSaved bool // saved once, perhaps forgotten since
	savedAt   time.Time
	ref       string          // of the stored performance
	detail    json.RawMessage // of the stored performance, for replays
	storedErr bool            // the stored answer is a 5xx (KindServerError)
	records   []int           // indexes of the key's records
}

// recordChunk is the length of a chunk of Fake.records.
const recordChunk = 1024

var (
	_ providers.Provider    = (*Fake)(nil)
	_ providers.KeyWindower = (*Fake)(nil)
)

// New returns a Fake configured by cfg.
func New(cfg Config) *Fake {
	if cfg.Name == "" {
		cfg.Name = "fake"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Fake{
		name:       cfg.Name,
		idempotent: cfg.Idempotent,
		window:     cfg.KeyWindow,
		now:        cfg.Now,
		latency:    cfg.Latency,
		faults:     cfg.Faults,
		maxRecords: cfg.MaxRecords,
		keys:       make(map[string]*keyState),
	}
}

// Name returns Config.Name.
func (f *Fake) Name() string { return f.name }

// Idempotent returns Config.Idempotent.
func (f *Fake) Idempotent() bool { return f.idempotent }

// KeyWindow returns Config.KeyWindow. (providers.KeyWindow reports 0 for a
// fake that is not idempotent, whatever it holds.)
func (f *Fake) KeyWindow() time.Duration { return f.window }

// Forget makes the fake forget the answer it stored for key, as a provider
// does when it prunes a key at the end of its window: the next call with
// the key is a new request, which performs again. The key's calls,
// performances and records are kept.
func (f *Fake) Forget(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ks := f.keys[key]; ks != nil {
		ks.saved = false
	}
	f.notifyLocked()
}

// remembersLocked reports whether the fake still holds the answer it stored
// for ks at now.
func (f *Fake) remembersLocked(ks *keyState, now time.Time) bool {
	return ks.saved && (f.window <= 0 || now.Sub(ks.savedAt) < f.window)
}

// ticket ties a call in flight to the state it was received in.
type ticket struct {
	gen uint64
	rec int // index in records, or -1 if not recorded
	n   int // the call's number for its key
}

// outcome is what a call did.
type outcome struct {
	res       providers.Result
	applied   Fault
	performed bool
	replayed  bool
	expired   bool
	ref       string
}

// Call receives c: it waits out the configured and injected latency, then
// answers as the fault plan says (see Fault) — performing c.Key, replaying
// it, or failing. A call whose ctx is done on arrival never reaches the fake
// (like a request that was never sent): it is not recorded and returns
// Retryable.
func (f *Fake) Call(ctx context.Context, c providers.Call) providers.Result {
	if err := ctx.Err(); err != nil {
		return providers.Retry(fmt.Errorf("fake provider: call not sent: %w", err), 0)
	}
	f.mu.Lock()
	t := f.beginLocked(c, f.now())
	if f.faults == nil && f.latency == 0 {
		// The benchmark path: one critical section, no fault, no wait.
		o, _ := f.decideLocked(c, None)
		f.finishLocked(t, o)
		f.mu.Unlock()
		return o.res
	}
	f.notifyLocked()
	f.mu.Unlock()

	fault := None
	if f.faults != nil {
		fault = f.faults(c, t.n)
	}
	if d := f.latency + fault.Latency; d > 0 {
		if err := sleep(ctx, d); err != nil {
			return f.finish(t, outcome{
				res:     providers.Unsure(fmt.Errorf("fake provider: no answer before the call's context ended: %w", err)),
				applied: Fault{Latency: fault.Latency},
			})
		}
	}

	f.mu.Lock()
	o, hang := f.decideLocked(c, fault)
	if !hang {
		f.finishLocked(t, o)
		f.mu.Unlock()
		return o.res
	}
	f.mu.Unlock()
	<-ctx.Done()
	o.res = providers.Unsure(fmt.Errorf("fake provider: hung until the call's context ended: %w", ctx.Err()))
	return f.finish(t, o)
}

// beginLocked counts and records a call that has arrived.
func (f *Fake) beginLocked(c providers.Call, now time.Time) ticket {
	ks := f.keyLocked(c.Key)
	ks.calls++
	f.stats.Calls++
	f.inFlight++
	t := ticket{gen: f.gen, rec: -1, n: ks.calls}
	if f.maxRecords <= 0 || f.nrec < f.maxRecords {
		if f.nrec%recordChunk == 0 {
			f.records = append(f.records, make([]CallRecord, recordChunk))
		}
		t.rec = f.nrec
		f.nrec++
		*f.recordLocked(t.rec) = CallRecord{
			Key: c.Key, EffectID: c.EffectID, Attempt: c.Attempt, N: ks.calls, At: now,
		}
		ks.records = append(ks.records, t.rec)
	}
	return t
}

// recordLocked returns the i-th record.
func (f *Fake) recordLocked(i int) *CallRecord {
	return &f.records[i/recordChunk][i%recordChunk]
}

// decideLocked applies fault to c and performs or replays c.Key if it says
// so. For a Hang it decides nothing and reports hang; the caller waits and
// then fills in the result.
//
// The replay rule: at an idempotent fake, a key whose answer the fake still
// remembers (inside Config.KeyWindow, not forgotten) is answered from the
// record, whatever fault the plan gave, like a real provider answers a
// repeated key from its cache before doing anything else. Only the faults
// that act on the way back still apply: latency (applied by the caller
// before this) and KindPerformedThenTimeout, which loses the replayed
// answer. A key the fake performed but no longer remembers is a new
// request: the plan's fault applies and a performance counts again.
func (f *Fake) decideLocked(c providers.Call, fault Fault) (o outcome, hang bool) {
	ks := f.keyLocked(c.Key)
	now := f.now()
	if f.idempotent && f.remembersLocked(ks, now) {
		f.stats.Replays++
		o.replayed, o.ref = true, ks.ref
		o.applied = Fault{Latency: fault.Latency}
		switch {
		case fault.Kind == KindPerformedThenTimeout:
			o.applied.Kind = KindPerformedThenTimeout
			o.res = providers.Unsure(ErrResponseLost)
		case ks.storedErr:
			o.res = providers.Unsure(ErrServerError)
		default:
			o.res = providers.Confirm(ks.ref, true, ks.detail)
		}
		return o, false
	}
	if ks.everSaved && f.idempotent {
		o.expired = true
		f.stats.Expired++
	}

	o.applied = fault
	if fault.performs() {
		ref, detail := f.performLocked(ks, c.Key, now)
		o.performed, o.ref = true, ref
		switch fault.Kind {
		case KindPerformedThenTimeout:
			o.res = providers.Unsure(ErrResponseLost)
		case KindServerError:
			ks.storedErr = true
			o.res = providers.Unsure(ErrServerError)
		default:
			o.res = providers.Confirm(ref, false, detail)
		}
		return o, false
	}
	switch fault.Kind {
	case KindRetryable:
		o.res = providers.Retry(ErrUnavailable, 0)
	case KindRateLimited:
		o.res = providers.Retry(ErrRateLimited, fault.RetryAfter)
	case KindReject:
		detail, _ := json.Marshal(struct {
			Key    string `json:"key"`
			Reason string `json:"reason"`
		}{c.Key, fault.Reason})
		o.res = providers.Reject(fmt.Errorf("%s: %w", fault.Reason, ErrRejected), detail)
	case KindServerError: // began, failed before performing, stored the 500
		if f.idempotent {
			ks.saved, ks.everSaved, ks.savedAt, ks.ref, ks.detail, ks.storedErr = true, true, now, "", nil, true
		}
		o.res = providers.Unsure(ErrServerError)
	case KindTimeoutBeforeSend:
		o.res = providers.Unsure(ErrTimeoutBeforeSend)
	case KindHang:
		return o, true
	default:
		o.res = providers.Reject(fmt.Errorf("fake provider: invalid fault %s", fault), nil)
	}
	return o, false
}

// performLocked performs key once more, stores its answer as the key's
// (replayed to later calls by an idempotent fake while it remembers it),
// and returns the performance's ref and confirmation detail.
func (f *Fake) performLocked(ks *keyState, key string, now time.Time) (string, json.RawMessage) {
	f.refSeq++
	ref := "fake_" + strconv.FormatInt(f.refSeq, 10)
	detail := confirmDetail(ref, key)
	ks.performed++
	f.stats.Performed++
	if ks.performed == 1 {
		f.stats.Keys++
	} else {
		f.stats.Duplicates++
	}
	if ks.performed == 1 || f.idempotent {
		ks.ref, ks.detail = ref, detail
	}
	ks.saved, ks.everSaved, ks.savedAt, ks.storedErr = true, true, now, false
	return ref, detail
}

// finish takes the lock and records how the call ended.
func (f *Fake) finish(t ticket, o outcome) providers.Result {
	f.mu.Lock()
	f.finishLocked(t, o)
	f.mu.Unlock()
	return o.res
}

// finishLocked records how the call ended, unless a Reset came in between.
func (f *Fake) finishLocked(t ticket, o outcome) {
	f.inFlight--
	if t.gen == f.gen {
		switch o.res.Class {
		case providers.Confirmed:
			f.stats.Confirmed++
		case providers.Rejected:
			f.stats.Rejected++
		case providers.Retryable:
			f.stats.Retryable++
		case providers.Unknown:
			f.stats.Unknown++
		}
		if t.rec >= 0 {
			r := f.recordLocked(t.rec)
			r.Fault, r.Class = o.applied, o.res.Class
			r.Performed, r.Replayed, r.Ref, r.Expired = o.performed, o.replayed, o.ref, o.expired
		}
	}
	f.notifyLocked()
}

func (f *Fake) keyLocked(key string) *keyState {
	ks := f.keys[key]
	if ks == nil {
		ks = &keyState{}
		f.keys[key] = ks
	}
	return ks
}

// notifyLocked wakes the goroutines in WaitUntil.
func (f *Fake) notifyLocked() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

func (f *Fake) statsLocked() Stats {
	s := f.stats
	s.InFlight = f.inFlight
	return s
}

// Performed returns how many times key was performed: 0 or 1 at an
// idempotent fake while it remembers the key, more once the key was
// repeated after its window; any number at another.
func (f *Fake) Performed(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ks := f.keys[key]; ks != nil {
		return ks.performed
	}
	return 0
}

// Calls returns a copy of the records of the calls for key, in the order
// they arrived.
func (f *Fake) Calls(key string) []CallRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	ks := f.keys[key]
	if ks == nil {
		return nil
	}
	out := make([]CallRecord, len(ks.records))
	for i, r := range ks.records {
		out[i] = *f.recordLocked(r)
	}
	return out
}

// AllCalls returns a copy of the records of every call, in the order they
// arrived.
func (f *Fake) AllCalls() []CallRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]CallRecord, 0, f.nrec)
	for _, chunk := range f.records {
		out = append(out, chunk[:min(len(chunk), f.nrec-len(out))]...)
	}
	return out
}

// Stats returns the fake's totals.
func (f *Fake) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.statsLocked()
}

// Reset forgets every call, key and total (but InFlight). Refs stay unique
// across it. A call in flight during Reset finishes against the new state:
// what it performs or replays is counted, its record and class are not.
func (f *Fake) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.keys = make(map[string]*keyState)
	f.records, f.nrec = nil, 0
	f.stats = Stats{}
	f.notifyLocked()
}

// WaitUntil blocks until cond holds for the fake's Stats or ctx is done. It
// checks cond now and again after every change (a call arriving or
// returning, a Reset), without polling. cond runs without the fake's lock.
// On ctx's end it returns an error that wraps the context's error and shows
// the last Stats.
func (f *Fake) WaitUntil(ctx context.Context, cond func(Stats) bool) error {
	for {
		f.mu.Lock()
		s := f.statsLocked()
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		changed := f.changed
		f.mu.Unlock()
		if cond(s) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("wait for fake provider %s (%s): %w", f.name, s, context.Cause(ctx))
		}
	}
}

// WaitForPerformed blocks until the fake has performed effects at least n
// times (Stats.Performed, duplicates included) or ctx is done.
func (f *Fake) WaitForPerformed(ctx context.Context, n int) error {
	return f.WaitUntil(ctx, func(s Stats) bool { return s.Performed >= n })
}

// sleep waits d or until ctx is done, whichever comes first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// confirmDetail returns {"ref":ref,"key":key}.
func confirmDetail(ref, key string) json.RawMessage {
	b := make([]byte, 0, len(`{"ref":"","key":""}`)+len(ref)+len(key))
	b = append(b, `{"ref":`...)
	b = appendJSONString(b, ref)
	b = append(b, `,"key":`...)
	b = appendJSONString(b, key)
	return append(b, '}')
}

func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // cannot fail for a string
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
