package daemon

import (
	"encoding/json"
	"testing"

	"github.com/sidefx/sidefx/outbox"
)

// outbox.Enqueued has the names of sidefx's JSON output.
func TestJSON_Enqueued(t *testing.T) {
	t.Parallel()
	b, err := json.Marshal([]outbox.Enqueued{{ID: 42, Key: "sfx1_abc", Inserted: true}, {ID: 43, Key: "sfx1_def"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := `[{"id":42,"idempotency_key":"sfx1_abc","inserted":true},{"id":43,"idempotency_key":"sfx1_def","inserted":false}]`; string(b) != want {
		t.Errorf("got %s\nwant %s", b, want)
	}
}
