package dispatcher

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"sort"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/sidefx/sidefx/effects"
	"github.com/sidefx/sidefx/providers"
)

// Config configures a Dispatcher. Zero fields take the defaults stated.
type Config struct {
	// Schema holds side_effects. Default "public".
	Schema string

	// Kinds is the registry: the effect kinds this dispatcher serves, each
	// with its provider and policy. It claims no other kind, so separate
	// deployments can serve separate kinds from one table. Required.
	Kinds map[string]Kind

	// Workers bounds the provider calls in flight. A call that returned
	// frees its slot at once; its outcome waits to be recorded, and the
	// dispatcher holds at most Workers+BatchSize claimed effects whose
	// outcome is not recorded. Default 200: calls are I/O-bound requests,
	// and a provider with its own rate limit gets Limits[…].Concurrency or
	// RatePerSecond. With a fast provider the claim is as large as the
	// free slots, so Workers also sets how many effects one claim takes:
	// the benchmark drains 20,000 effects through an instant provider at
	// about 11,000/s with 100 workers and 15,000/s with 200, within the
	// noise of 1,000 (docs/benchmarks.md).
	//
	// The workers are shared out among the providers, so that a provider
	// that hangs or is slow never holds the slots another one needs: each
	// provider without a Limits entry's Concurrency gets an equal share of
	// what the Concurrency limits leave (Workers, less the set
	// Concurrency values, divided among the others; the remainder goes one
	// each to the first providers by name; at least 1 each). A provider
	// alone gets every worker. A provider never holds more than its share,
	// even while the others are idle: a call cannot be taken back once
	// made, so a slot lent to a provider that then hangs would be lost to
	// the others until the call's Timeout. Raise Workers, or a provider's
	// Limit.Concurrency, for more calls to one provider in flight.
	Workers int

	// BatchSize bounds the effects one claim statement takes and the
	// outcomes one statement records. Default 200.
	BatchSize int

	// ClaimMaxBytes bounds the payload bytes (their JSON text) one claim
	// takes, besides BatchSize: a claim takes effects in order while their
	// payloads' total stays within it, and always the first, so an effect
	// larger than ClaimMaxBytes is claimed alone. With ClaimLoops claims
	// at once and Workers calls in flight, a dispatcher holds the payloads
	// of about ClaimLoops claims. Default DefaultClaimMaxBytes (16 MiB),
	// for a small container; negative: no bound in bytes.
	ClaimMaxBytes int64

	// MaxRescues quarantines a poison effect: one whose lease ran out
	// this many times in a row with no outcome recorded (its claim or its
	// call ended the process, by a crash, running out of memory or a
	// hang) is ended uncertain by the rescuer, its last_error saying
	// "quarantined: …", instead of being put back to end the next
	// process too. An outcome sets the count back to 0. Default
	// DefaultMaxRescues (3); negative: no bound.
	MaxRescues int

	// Lease is how long a claimed effect stays fired before the rescuer
	// decides its worker died. It must exceed every kind's Timeout. Default
	// 60s.
	Lease time.Duration

	// ClaimLoops is how many claims may run at once. The first claims
	// whenever something may be due; the others join only while claims
	// come back full (a backlog), so a drain keeps the database busier than
	// one claim at a time would. Each reserves its slots before its claim.
	// Default 1: on 2 cores a second loop measured no faster, and less
	// steady (docs/benchmarks.md); a larger server may gain from 2.
	ClaimLoops int

	// PollInterval is how often an idle dispatcher looks for due effects:
	// a cheap probe (one read of the pending index, no write), followed by
	// a claim only when an effect is due. Producers notify nobody (NOTIFY
	// would serialize their commits), so it bounds how long a new effect
	// waits for an idle dispatcher. Default 10ms: about 100 probes a
	// second per idle dispatcher, each a few tens of microseconds of
	// database time; raise it where many replicas idle and a longer wait
	// is fine.
	PollInterval time.Duration

	// RescueInterval is how often expired leases are rescued (by one replica
	// at a time). Default Lease/4, at least 1s.
	RescueInterval time.Duration

	// Retention is how long confirmed, failed and cancelled effects are kept
	// whole before the reaper compacts them into tombstones: the payload and
	// the stored answer go; the (source_id, kind) guard, key, payload hash,
	// final state, reference, times and history stay, so a replay is still
	// a duplicate. Default 720h (30 days). Negative disables the reaper.
	Retention time.Duration

	// TombstoneRetention, if positive, is how long tombstones are kept
	// before they are deleted. Deleting a tombstone frees its (source_id,
	// kind): a replay of its source afterwards enqueues the effect again,
	// under a key the provider may have forgotten, so it may be performed
	// twice. Set it only longer than any replay of the sources. Default 0:
	// tombstones are kept forever.
	TombstoneRetention time.Duration

	// ReapInterval is how often the reaper runs (one replica at a time).
	// Default 1h.
	ReapInterval time.Duration

	// HeartbeatInterval is how often the dispatcher records in the
	// registry (sidefx_dispatchers) that it is alive and which kinds it
	// serves; it reads as dead after three intervals without one. Every
	// sixth heartbeat it also logs the pending effects of kinds no live
	// dispatcher serves. Default 10s.
	HeartbeatInterval time.Duration

	// ShutdownTimeout bounds how long Run waits, after its context ends, for
	// the claim in progress and the calls in flight; calls still running
	// then are cancelled and recorded as unknown. Recording the outcomes
	// gets up to ShutdownTimeout more, so Run returns within about twice
	// this. Default 30s.
	ShutdownTimeout time.Duration

	// Limits bounds calls per provider, by provider name. A provider with no
	// entry is bounded by Workers alone.
	Limits map[string]Limit

	// WorkerID is recorded in claimed_by. Default host-pid-random.
	WorkerID string

	// TracerProvider, if set, traces each effect's dispatch: a span from
	// its claim to its recorded outcome, the child of (and linked to) the
	// span that enqueued it (the effect's stored traceparent), with the
	// provider's HTTP requests as its children (providers.Traced). Default
	// nil: nothing is traced.
	TracerProvider trace.TracerProvider

	// ListenPool, if set, gives the connection the notification listener
	// holds for its LISTEN: a session of its own, which a pooler in
	// transaction mode (PgBouncer's pool_mode=transaction) cannot keep.
	// Default nil: a connection taken from the dispatcher's pool.
	ListenPool *pgxpool.Pool

	// Logger receives the dispatcher's logs. Default slog.Default().
	Logger *slog.Logger

	// FailureLogEvery sets how often a provider failing in a row is logged
	// at warn: its first retryable or unknown answer after a definite one
	// (or since Run started), and every FailureLogEvery-th in a row after
	// it, with the provider, kind, attempt and reason; the others are
	// logged at debug. The first definite answer after such a streak is
	// logged at info. Default 100.
	FailureLogEvery int

	// Observer is told of every outcome, rescue and reap, for metrics; of
	// every provider pause too if it implements PauseObserver, of every
	// failed database statement if it implements ErrorObserver, and of
	// every provider answer with the provider's failure streak if it
	// implements ProviderObserver. Default none.
	Observer Observer
}

// Kind is the policy of one effect kind.
type Kind struct {
	// Provider performs the kind's effects. Required.
	Provider providers.Provider

	// MaxAttempts bounds the attempts per effect (an effect's own
	// max_attempts overrides it). A retryable outcome on the last attempt
	// makes the effect failed; an unknown one makes it uncertain. Default 25.
	MaxAttempts int

	// Timeout bounds one provider call. Default 30s; must be below Lease.
	Timeout time.Duration

	// BackoffBase and BackoffMax shape the delay before attempt n+1: a random
	// duration between half and all of min(BackoffMax, BackoffBase·2^(n-1))
	// (computed without overflow, whatever n), at least the provider's
	// Retry-After. Defaults 1s and 1h.
	//
	// BackoffMax also caps a Retry-After: a provider asking for more (a
	// year, by mistake or malice) gets BackoffMax. A retryable answer with a
	// Retry-After pauses claims for every kind of its provider until then
	// (see the package doc).
	BackoffBase time.Duration
	BackoffMax  time.Duration

	// AtLeastOnce lets a kind whose provider is not idempotent be retried
	// after an unknown outcome, accepting a possible duplicate (an email
	// sent twice) over an uncertain effect. Default false: at most once.
	AtLeastOnce bool

	// OutlastKeyWindow accepts a retry policy (MaxAttempts, Timeout and
	// backoff) whose attempts can end after the provider's key window has
	// passed since the first (providers.KeyWindow). Such attempts are never
	// made for an effect that may have been performed: it is left uncertain.
	// Default false: New refuses such a policy.
	OutlastKeyWindow bool

	// NotifyOutcome announces each effect of the kind on the outcome
	// channel once it is settled (confirmed, failed or cancelled): an API
	// that answers with the effect's outcome (edge.RequireOutcome) is woken
	// at once instead of polling. Default false: NOTIFY serializes the
	// commits of the transactions that send one, a cost only kinds whose
	// outcome someone awaits should pay.
	NotifyOutcome bool
}

// keyWindow is how long k's provider remembers a key: 0 for a provider that
// takes no key (whose repeats, at least once, are duplicates anyway) or
// that never forgets one.
func (k Kind) keyWindow() time.Duration {
	if !k.Provider.Idempotent() {
		return 0
	}
	return providers.KeyWindow(k.Provider)
}

// RetrySpan is the longest time from the start of an effect's first
// attempt to the end of its last under k's policy: every attempt running its
// full Timeout, and the longest backoff, min(BackoffMax, BackoffBase·2^(n-1)),
// after attempt n. A Retry-After never stretches a wait past BackoffMax.
func RetrySpan(k Kind) time.Duration {
	const forever = 100 * 365 * 24 * time.Hour
	span := k.Timeout
	for n := 1; n < k.MaxAttempts && span < forever; n++ {
		span += backoffCeiling(k.BackoffBase, k.BackoffMax, n) + k.Timeout
	}
	return span
}

// Limit bounds the calls to one provider.
type Limit struct {
	// Concurrency bounds the calls in flight, at most Workers in one
	// dispatcher. 0: the provider's share of Workers (see
	// Config.Workers), which is per process whatever the Scope. A
	// Concurrency above the share lets this provider hold slots the
	// others' shares would have: if it hangs, they get fewer.
	Concurrency int
	// RatePerSecond bounds the calls started per second. 0: unlimited.
	RatePerSecond float64
	// Burst is the number of calls that may start at once under the rate.
	// Default max(1, RatePerSecond).
	Burst int
	// Scope says what Concurrency, RatePerSecond and Burst bound.
	// ScopeFleet (the default, ""): every live dispatcher of the database
	// together; each takes a share at its heartbeats (see the package
	// doc, "Limits across the fleet"). ScopeProcess: each dispatcher
	// process on its own, so N replicas make N times the calls.
	Scope LimitScope
}

// LimitScope is what a provider's Limit bounds: the fleet's calls or one
// process's.
type LimitScope string

// The scopes of a Limit.
const (
	// ScopeFleet: the limits hold across every live dispatcher of the
	// database serving the provider; each holds a share, set at its
	// heartbeats. The default.
	ScopeFleet LimitScope = "fleet"
	// ScopeProcess: the limits hold in each dispatcher process on its own.
	ScopeProcess LimitScope = "process"
)

// fleet reports whether l is shared across the fleet: its scope is
// ScopeFleet and it sets a concurrency or a rate.
func (l Limit) fleet() bool {
	return l.Scope != ScopeProcess && (l.Concurrency > 0 || l.RatePerSecond > 0)
}

// burst is l's burst, its default filled in.
func (l Limit) burst() int {
	if l.Burst == 0 {
		return max(1, int(l.RatePerSecond))
	}
	return l.Burst
}

// Defaults.
const (
	DefaultWorkers           = 200
	DefaultBatchSize         = 200
	DefaultClaimMaxBytes     = 16 << 20
	DefaultMaxRescues        = 3
	DefaultLease             = 60 * time.Second
	DefaultPollInterval      = 10 * time.Millisecond
	DefaultClaimLoops        = 1
	DefaultRetention         = 30 * 24 * time.Hour
	DefaultReapInterval      = time.Hour
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultShutdownTimeout   = 30 * time.Second
	DefaultMaxAttempts       = 25
	DefaultTimeout           = 30 * time.Second
	DefaultBackoffBase       = time.Second
	DefaultBackoffMax        = time.Hour
	DefaultFailureLogEvery   = 100
)

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid dispatcher configuration")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// withDefaults returns a copy of cfg with defaults filled in, or an error
// naming the first field that is wrong.
func withDefaults(cfg *Config) (Config, error) {
	if cfg == nil {
		return Config{}, configErr("no config")
	}
	c := *cfg
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.ClaimMaxBytes == 0 {
		c.ClaimMaxBytes = DefaultClaimMaxBytes
	}
	if c.MaxRescues == 0 {
		c.MaxRescues = DefaultMaxRescues
	}
	if c.FailureLogEvery == 0 {
		c.FailureLogEvery = DefaultFailureLogEvery
	}
	def(&c.Lease, DefaultLease)
	def(&c.PollInterval, DefaultPollInterval)
	if c.ClaimLoops == 0 {
		c.ClaimLoops = DefaultClaimLoops
	}
	def(&c.RescueInterval, max(c.Lease/4, time.Second))
	def(&c.Retention, DefaultRetention)
	def(&c.ReapInterval, DefaultReapInterval)
	def(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&c.ShutdownTimeout, DefaultShutdownTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.WorkerID == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		c.WorkerID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	}
	switch {
	case c.Workers < 0:
		return c, configErr("Workers is %d, it must be positive", c.Workers)
	case c.BatchSize < 0:
		return c, configErr("BatchSize is %d, it must be positive", c.BatchSize)
	case c.FailureLogEvery < 0:
		return c, configErr("FailureLogEvery is %d, it must be positive", c.FailureLogEvery)
	case c.Lease < time.Second:
		return c, configErr("Lease is %s, it must be at least 1s", c.Lease)
	case c.TombstoneRetention < 0:
		return c, configErr("TombstoneRetention is %s: want 0 (keep tombstones forever) or a positive duration", c.TombstoneRetention)
	case c.ClaimLoops < 0:
		return c, configErr("ClaimLoops is %d: want at least 1 (0: the default, %d)", c.ClaimLoops, DefaultClaimLoops)
	case c.PollInterval < 0 || c.RescueInterval < 0 || c.ReapInterval < 0 || c.ShutdownTimeout < 0 || c.HeartbeatInterval < 0:
		return c, configErr("intervals and timeouts must not be negative")
	case len(c.Kinds) == 0:
		return c, configErr("Kinds is empty: a dispatcher serves at least one kind")
	}
	kinds := make(map[string]Kind, len(c.Kinds))
	for name, k := range c.Kinds {
		if err := effects.ValidateKind(name); err != nil {
			return c, configErr("Kinds[%q]: %v", name, err)
		}
		if k.Provider == nil {
			return c, configErr("Kinds[%q].Provider is nil", name)
		}
		if k.MaxAttempts == 0 {
			k.MaxAttempts = DefaultMaxAttempts
		}
		def(&k.Timeout, DefaultTimeout)
		def(&k.BackoffBase, DefaultBackoffBase)
		def(&k.BackoffMax, DefaultBackoffMax)
		switch {
		case k.MaxAttempts < 0:
			return c, configErr("Kinds[%q].MaxAttempts is %d, it must be positive", name, k.MaxAttempts)
		case k.Timeout < 0 || k.BackoffBase < 0 || k.BackoffMax < 0:
			return c, configErr("Kinds[%q]: durations must not be negative", name)
		case k.Timeout >= c.Lease:
			return c, configErr("Kinds[%q].Timeout %s is not below Lease %s: a call could outlive its lease and be fired twice", name, k.Timeout, c.Lease)
		case k.BackoffMax < k.BackoffBase:
			return c, configErr("Kinds[%q].BackoffMax %s is below BackoffBase %s", name, k.BackoffMax, k.BackoffBase)
		case k.keyWindow() > 0 && !k.OutlastKeyWindow && RetrySpan(k) >= k.keyWindow():
			return c, configErr("Kinds[%q]: its attempts can span %s, past provider %s's key window of %s: an attempt after it could perform the effect twice, so it would not be made and the effect would be left uncertain; lower MaxAttempts or BackoffMax, or set OutlastKeyWindow to accept that",
				name, RetrySpan(k).Round(time.Minute), k.Provider.Name(), k.keyWindow())
		case k.AtLeastOnce && k.Provider.Idempotent():
			return c, configErr("Kinds[%q].AtLeastOnce is set but provider %s is idempotent: it is retried with the same key anyway", name, k.Provider.Name())
		}
		kinds[name] = k
	}
	c.Kinds = kinds
	for name, l := range c.Limits {
		used := false
		for _, k := range c.Kinds {
			used = used || k.Provider.Name() == name
		}
		if !used {
			return c, configErr("Limits[%q] names no provider of the configured kinds", name)
		}
		if l.Concurrency < 0 || l.RatePerSecond < 0 || l.Burst < 0 || math.IsNaN(l.RatePerSecond) || math.IsInf(l.RatePerSecond, 0) {
			return c, configErr("Limits[%q]: values must be finite and not negative", name)
		}
		if l.Scope != "" && l.Scope != ScopeFleet && l.Scope != ScopeProcess {
			return c, configErr("Limits[%q].Scope is %q: want %q (the default) or %q", name, l.Scope, ScopeFleet, ScopeProcess)
		}
	}
	return c, nil
}

// shares returns the calls in flight each provider may hold, by name:
// its Limits Concurrency if set (at most Workers), else an equal share of
// the workers the set ones leave, the remainder going one each to the
// first providers by name, at least 1 each.
func (c *Config) shares() map[string]int {
	var names []string
	seen := map[string]bool{}
	for _, kind := range c.servedKinds() {
		if name := c.Kinds[kind].Provider.Name(); !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	sort.Strings(names)
	out := make(map[string]int, len(names))
	left := c.Workers
	var open []string
	for _, name := range names {
		if l := c.Limits[name].Concurrency; l > 0 {
			out[name] = min(l, c.Workers)
			left -= out[name]
		} else {
			open = append(open, name)
		}
	}
	left = max(left, 0)
	for i, name := range open {
		share := left / len(open)
		if i < left%len(open) {
			share++
		}
		out[name] = max(share, 1)
	}
	return out
}

// servedKinds lists the configured kinds in order.
func (c *Config) servedKinds() []string {
	ks := make([]string, 0, len(c.Kinds))
	for k := range c.Kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
