// Package metrics exposes sidefx's Prometheus metrics: the state of the
// side_effects table, read through engine.Store.Stats, and what the
// dispatcher does, through its dispatcher.Observer hook (and the optional
// dispatcher.ErrorObserver and dispatcher.ProviderObserver).
//
//	reg := prometheus.NewRegistry()
//	m, err := metrics.New(reg, store, &metrics.Options{Version: version})
//	d, err := dispatcher.New(pool, &dispatcher.Config{Observer: m, ...})
//	http.Handle("/metrics", metrics.Handler(reg))
//
// # Metrics
//
// From the table, read at most once per Options.StatsInterval (scrapes in
// between get the last reading):
//
//	sidefx_effects{kind,state}               gauge: effects of kind in state; every
//	                                         state of every kind seen since start is
//	                                         exposed, 0 when empty
//	sidefx_oldest_pending_seconds{kind}      gauge: how long the kind's longest-due
//	                                         pending effect has been due (database
//	                                         clock): from next_attempt_at, so a
//	                                         scheduled or backing-off effect is not
//	                                         late; 0 if none is due
//	sidefx_unserved_pending{kind}            gauge: pending effects of the kind when no
//	                                         live dispatcher serves it, else 0
//	sidefx_stats_errors_total                counter: failed or timed-out table reads
//
// From the dispatcher:
//
//	sidefx_dispatch_total{kind,provider,outcome}
//	                                         counter: provider calls by outcome, one per
//	                                         call: the provider's class (confirmed,
//	                                         rejected, retryable, unknown), or fenced
//	sidefx_effect_transitions_total{kind,state}
//	                                         counter: states recorded after a call
//	                                         (confirmed, failed, pending, uncertain)
//	sidefx_provider_replays_total{provider}  counter: duplicates a provider absorbed
//	sidefx_provider_call_seconds{provider}   histogram: provider call wall time
//	sidefx_confirm_latency_seconds{kind}     histogram: enqueue to confirmation
//	sidefx_rescued_total{kind,state}         counter: expired leases rescued, by the
//	                                         state the effect was moved to
//	sidefx_reaped_total                      counter: terminal effects deleted
//	sidefx_dispatcher_errors_total{op,class} counter: failed database statements
//	                                         of the dispatcher, by operation (claim,
//	                                         record, rescue, reap, listen) and class
//	                                         (auth, privilege, undefined, mismatch,
//	                                         read_only: persistent, the daemon is not
//	                                         ready until fixed; data, transient);
//	                                         every series at 0 from the start
//	sidefx_provider_consecutive_failures{provider}
//	                                         gauge: retryable and unknown answers in a
//	                                         row from the provider (0 after a confirmed
//	                                         or rejected one), via the optional
//	                                         dispatcher.ProviderObserver
//	sidefx_provider_last_success_timestamp_seconds{provider}
//	                                         gauge: unix time of the provider's last
//	                                         definite answer, 0 if none since start
//	sidefx_provider_share{provider,limit}    gauge: this dispatcher's share of a
//	                                         provider's limits shared across the fleet,
//	                                         set at each heartbeat; limit is rate,
//	                                         burst or concurrency; via the optional
//	                                         dispatcher.ShareObserver
//	sidefx_build_info{version}               gauge: always 1
//
// Names lists them all, for dashboards and alerts to be checked against.
//
// # Fenced outcomes
//
// A fenced call is one whose answer was not recorded because the effect's
// lease was rescued and a newer attempt claimed it. It counts in
// sidefx_dispatch_total with outcome="fenced" instead of its class, so the
// outcomes of a kind add up to its provider calls and a fenced answer is
// never mistaken for a recorded one; the dispatcher logs the answer it
// dropped. A fenced call still counts in sidefx_provider_call_seconds and,
// if the provider absorbed a duplicate, in sidefx_provider_replays_total,
// since the call was made; it does not count in
// sidefx_effect_transitions_total or sidefx_confirm_latency_seconds, since
// nothing was recorded.
//
// # Cardinality
//
// Labels hold only kinds, providers, states and outcomes, all bounded by the
// configuration; never an effect's id, source or key. The table's gauges
// see the kinds producers wrote, which nothing bounds: only the kinds of
// Options.Kinds (the daemon's served kinds) have series of their own, and
// the others are summed under kind="_other" (OtherKind). Without
// Options.Kinds, the first MaxKinds kinds seen keep series of their own.
//
// # Cost
//
// A table read is one aggregate statement over the whole of side_effects. It
// runs at most once per StatsInterval whatever the number of scrapers, and
// is bounded by StatsTimeout: a scrape waits no longer than that, and if the
// read has not finished it gets the last reading (the read goes on in the
// background until its own timeout, and no second read starts meanwhile).
package metrics
