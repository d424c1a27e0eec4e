package engine

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = "public"

// MaxSchemaLen leaves room for the channel prefix within PostgreSQL's
// 63-byte identifier limit.
const MaxSchemaLen = 48

var schemaRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// CheckSchema returns schema, or DefaultSchema when it is empty, after checking
// that it is a plain identifier.
func CheckSchema(schema string) (string, error) {
	if schema == "" {
		return DefaultSchema, nil
	}
	if len(schema) > MaxSchemaLen {
		return "", fmt.Errorf("schema %q is %d bytes, the limit is %d", schema, len(schema), MaxSchemaLen)
	}
	if !schemaRE.MatchString(schema) {
		return "", fmt.Errorf("schema %q is not a plain identifier (letters, digits and _, not starting with a digit)", schema)
	}
	return schema, nil
}

// Quote returns schema quoted for use in SQL text.
func Quote(schema string) string {
	return pgx.Identifier{schema}.Sanitize()
}

// Channel is the LISTEN/NOTIFY channel enqueues in schema notify on.
func Channel(schema string) string {
	return "sidefx_" + schema
}

// OutcomeChannel is the LISTEN/NOTIFY channel on which the dispatcher
// announces the settled effects of kinds whose outcome is awaited
// (dispatcher.Kind.NotifyOutcome), each notification's payload an effect's
// id.
func OutcomeChannel(schema string) string {
	return "sidefx_outcome_" + schema
}
