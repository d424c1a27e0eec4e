// Package scenario runs sidefx as a user would and checks that the effects
// end right: the built sidefx binary, configured by a sidefx.yaml, against a
// throwaway PostgreSQL (internal/lab/pgtest), a stateful Stripe peer
// (stripe-stateful-mock, internal/lab/peers) behind a FaultProxy that loses
// answers or stores 500s, and an EchoReceiver that echoes every request back
// to the webhook provider.
//
// The tests are the user scenarios of issue 12's "Done when":
//
//   - TestScenario_MaybePerformedChargeCannotBeCancelled
//   - TestScenario_LostAnswersEndConfirmedWithTheirReference
//   - TestScenario_ReplayAfterReapingEnqueuesNothing
//   - TestScenario_Stripe500sEndUncertainPerformedOnce
//   - TestScenario_NoEchoedSecretIsStoredPrintedOrLogged
//
// What is not a test is harness, exported for reuse:
//
//	peer := peers.StartStripeStateful(t)
//	proxy, _ := scenario.NewFaultProxy(peer.URL, scenario.FirstOfKey(2, scenario.LoseAnswer))
//	defer proxy.Close()
//	// base_url: proxy.URL; later proxy.Stats(key).Performed == 1
//
// A FaultProxy chooses each request's Mode (Pass, LoseAnswer, Stored500)
// by a deterministic Schedule, for all requests or per Idempotency-Key, and
// counts per key what reached the peer and what the peer performed (a 2xx
// that is not a replay). A stored 500 is replayed for every later request
// with its key without forwarding, as Stripe does.
//
// The tests skip when stripe-stateful-mock is not installed (`make deps`)
// and CI is not "true"; in CI they fail instead.
package scenario
