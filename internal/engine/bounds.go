package engine

import "strconv"

// The bounds migration 0035 holds side_effects' variable columns to (CHECK
// constraints): what a claim returns besides the payload is bounded, so
// nobody (an operator's sidefx_resolve, a provider's answer) can make one
// effect too large to claim.
const (
	// MaxProviderRef bounds provider_ref, in characters: a longer
	// reference from a provider is cut, one from an operator refused.
	MaxProviderRef = 255
	// maxLastError bounds last_error, in characters (a dispatcher writes
	// at most effects.MaxOutcomeBytes of an error).
	maxLastError = 131072
	// maxOutcomeBytes bounds the outcome a dispatcher stores, as JSON text
	// in bytes: a larger answer is replaced by a marker that says so.
	maxOutcomeBytes = 65536
	// maxOutcomeCheck is the database's bound on an outcome's JSON text,
	// over the dispatcher's to hold what it stored before (its 64 KiB
	// of input may grow in jsonb's rendering).
	maxOutcomeCheck = 262144
	// MaxPauses bounds how many pauses are held (sidefx_set_pause refuses
	// more) and read.
	MaxPauses = 10000
)

var (
	maxRefChars       = strconv.Itoa(MaxProviderRef)
	maxLastErrorChars = strconv.Itoa(maxLastError)
)

// boundedOutcome is jsonb expression x (NULL stays NULL), or when its
// JSON text is over limit bytes, a marker object that says how large it
// was.
func boundedOutcome(x string, limit int) string {
	n := strconv.Itoa(limit)
	return `(CASE WHEN coalesce(pg_catalog.octet_length((` + x + `)::text), 0) OPERATOR(pg_catalog.<=) ` + n + ` THEN ` + x + `
		ELSE pg_catalog.jsonb_build_object('sidefx_dropped'::text, pg_catalog.format('the outcome was %s bytes as JSON, over the limit of ` + n + `'::text,
			pg_catalog.octet_length((` + x + `)::text))) END)`
}

// otherBytes is the size in bytes of the variable columns a claim returns
// besides the payload, counted in its budget.
const otherBytes = `(coalesce(pg_catalog.octet_length(provider_ref), 0)::bigint
	OPERATOR(pg_catalog.+) coalesce(pg_catalog.octet_length(outcome::text), 0)::bigint
	OPERATOR(pg_catalog.+) coalesce(pg_catalog.octet_length(last_error), 0)::bigint)`
