package config

import _ "embed" // Reference

// Reference is a complete configuration file: every field the file may
// hold, with its meaning and default as the field's documentation in this
// package gives them, and example providers, kinds and a drift rule. It is
// valid as it stands once the environment variables it names are set.
//
// It is generated, with the table of docs/config-reference.md, from the
// documentation of the configuration's fields: after changing one, run
//
//	go test ./config -run TestReference -update
//
//go:embed reference.yaml
var Reference string
