package ptype

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written in the file as Go writes durations:
// "60s", "1m30s", "720h". A bare number is refused, since it has no unit.
// Zero (unset, or "0s") means the field's default.
type Duration time.Duration

// String formats d as time.Duration does ("1m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes d as String does, which UnmarshalYAML reads back.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalYAML reads a duration string. Its errors are *yaml.TypeError, so
// that decoding goes on and every bad field is reported.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return nodeError(n, "want a duration such as 60s, got %s", describeNode(n))
	}
	switch n.ShortTag() {
	case "!!int", "!!float":
		return nodeError(n, "%s is not a duration: a bare number has no unit (want e.g. %ss)", n.Value, n.Value)
	}
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		return nodeError(n, "%q is not a duration (want e.g. 60s, 5m, 720h)", n.Value)
	}
	*d = Duration(v)
	return nil
}

// nodeError is a decoding error at n. Its "line L: column C: " prefix lets
// the configuration find the field n is the value of.
func nodeError(n *yaml.Node, format string, args ...any) error {
	msg := fmt.Sprintf("line %d: column %d: %s", n.Line, n.Column, fmt.Sprintf(format, args...))
	return &yaml.TypeError{Errors: []string{msg}}
}

// describeNode names what a node is, for "want …, got …".
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return fmt.Sprintf("%q", n.Value)
}
