package derive_test

import (
	"fmt"

	"github.com/sidefx/sidefx/derive"
)

func ExampleKey() {
	fmt.Println(derive.Key("order-1042", "charge.payment_intents.create"))
	// Output: sfx1_e3942847fa67dc140e91cf66f703b8705bc161ee351b86d394ec396fac90b262
}

// A two-step effect sends one key per step, each stable across retries.
func ExampleChild() {
	key := derive.Key("order-1042", "charge.payment_intents.create")
	fmt.Println(derive.Child(key, "create") != derive.Child(key, "confirm"))
	// Output: true
}

// An API edge turns a client's retried request into the same domain id.
func ExampleDomainID() {
	a := derive.DomainID("tenant-7", "client-req-123")
	b := derive.DomainID("tenant-7", "client-req-123")
	fmt.Println(a == b, a)
	// Output: true 296deb59-4fe2-827c-87d5-39977e31ce66
}
