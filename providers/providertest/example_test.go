package providertest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
)

// An idempotent fake loses the answer to a key's first call after
// performing it; the retry with the same key is answered from its record,
// so the charge happens once.
func Example() {
	ctx := context.Background()
	fake := providertest.New(providertest.Config{
		Name:       "stripe",
		Idempotent: true,
		Faults:     providertest.FailFirst(1, providertest.PerformedThenTimeout),
	})
	call := providers.Call{Key: "sfx1_example", Attempt: 1}

	first := fake.Call(ctx, call)
	call.Attempt++
	retry := fake.Call(ctx, call)

	fmt.Println("first:", first.Class)
	fmt.Println("retry:", retry.Class, "replayed:", retry.Replayed, "ref:", retry.Ref)
	fmt.Println("performed:", fake.Performed(call.Key))
	fmt.Println(fake.Stats())
	// Output:
	// first: unknown
	// retry: confirmed replayed: true ref: fake_1
	// performed: 1
	// calls=2 in_flight=0 performed=1 replays=1 duplicates=0 expired=0 keys=1 confirmed=1 rejected=0 retryable=0 unknown=1
}

// Over HTTP, the fake lives in the test's process and a dispatcher in
// another process reaches it with a Client. A refused connection is
// Retryable: the request surely was not sent.
func ExampleNewServer() {
	ctx := context.Background()
	fake := providertest.New(providertest.Config{Idempotent: true})
	srv := providertest.NewServer(fake)

	client, err := providertest.NewClient(providertest.ClientConfig{URL: srv.URL(), Idempotent: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	call := providers.Call{Key: "sfx1_example", Attempt: 1}
	fmt.Println(client.Call(ctx, call).Class)
	fmt.Println(client.Call(ctx, call).Replayed)

	srv.Close()
	client.Close() // drop the pooled connection, so the next call dials
	fmt.Println(client.Call(ctx, call).Class)
	// Output:
	// confirmed
	// true
	// retryable
}

// An idempotent fake with Stripe's 24-hour key window, on a clock the test
// moves: a repeat inside the window is absorbed, a repeat after it performs
// the effect again — the duplicate the dispatcher must never cause.
func ExampleConfig_keyWindow() {
	ctx := context.Background()
	clock := providertest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	fake := providertest.New(providertest.Config{
		Idempotent: true,
		KeyWindow:  24 * time.Hour,
		Now:        clock.Now,
	})
	call := providers.Call{Key: "sfx1_example", Attempt: 1}
	fake.Call(ctx, call)

	clock.Advance(23 * time.Hour)
	call.Attempt++
	fmt.Println("after 23h: replayed", fake.Call(ctx, call).Replayed, "performed", fake.Performed(call.Key))

	clock.Advance(time.Hour)
	call.Attempt++
	fmt.Println("after 24h: replayed", fake.Call(ctx, call).Replayed, "performed", fake.Performed(call.Key))
	fmt.Println("window:", providers.KeyWindow(fake), "expired:", fake.Stats().Expired)
	// Output:
	// after 23h: replayed true performed 1
	// after 24h: replayed false performed 2
	// window: 24h0m0s expired: 1
}
