package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Load reads the configuration file at path, applies the environment
// overrides read with getenv (nil: os.Getenv), fills the defaults and
// validates. An invalid configuration gives every problem at once, joined,
// each a *FieldError naming the file, line and field. The returned Config
// carries the warnings in Warnings.
//
// types are the provider types a provider's type field may name: the
// built-in ones (builtin.Types()) and a program's own (NewProviderType,
// ptype.New). The configuration knows no other: a provider of another type
// is an error naming those it knows. A type named twice, or not made by
// NewProviderType or ptype.New, is an error that is not ErrInvalid.
func Load(path string, getenv func(string) string, types ...ProviderType) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return parse(path, data, getenv, types)
}

// Parse is Load for a configuration already in memory; its errors name no
// file.
func Parse(data []byte, getenv func(string) string, types ...ProviderType) (*Config, error) {
	return parse("", data, getenv, types)
}

func parse(file string, data []byte, getenv func(string) string, types []ProviderType) (*Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	reg, err := newRegistry(types)
	if err != nil {
		return nil, err
	}
	c := &Config{ProviderTypes: slices.Clone(types), reg: reg}
	decodeProblems, lines := decode(data, c)
	if len(decodeProblems) > 0 && lines == nil {
		// Not YAML, or not one document: nothing else is worth saying.
		for _, p := range decodeProblems {
			p.File = file
		}
		return nil, joinErrors(decodeProblems)
	}
	// A key repeated in a mapping leaves that mapping undecoded (the YAML
	// decoder stops there): whatever validation would say of it (no kinds,
	// a provider missing) follows from the repetition, and is not said.
	if slices.ContainsFunc(decodeProblems, func(p *FieldError) bool { return strings.HasPrefix(p.Problem, repeatedProblem) }) {
		for _, p := range decodeProblems {
			p.File = file
		}
		return nil, joinErrors(decodeProblems)
	}
	env := c.applyEnv(getenv)
	c.resolveDatabases(getenv)
	c.fillDefaults()
	warnings, problems := c.validate(env)

	// A field that did not decode is reported once, as such, not again as
	// whatever its zero value makes it.
	failed := make([]string, 0, len(decodeProblems))
	for _, p := range decodeProblems {
		if p.Path != "" {
			failed = append(failed, p.Path)
		}
	}
	all := decodeProblems
	for _, p := range problems {
		if slices.ContainsFunc(failed, func(f string) bool { return within(p.Path, f) }) {
			continue
		}
		if p.Line == 0 && p.Env == "" {
			p.Line = lineOf(lines, p.Path)
		}
		all = append(all, p)
	}
	slices.SortStableFunc(all, func(a, b *FieldError) int { return a.Line - b.Line })
	for _, p := range all {
		p.File = file
	}
	if err := joinErrors(all); err != nil {
		return nil, err
	}
	c.Warnings = warnings
	return c, nil
}

// applyEnv applies the environment overrides and returns the paths they
// set, with the variable each came from.
func (c *Config) applyEnv(getenv func(string) string) map[string]string {
	from := map[string]string{}
	for _, o := range []struct {
		env, path string
		field     *string
	}{
		{EnvDatabaseURL, "database_url", &c.DatabaseURL},
		{EnvSessionDatabaseURL, "session_database_url", &c.SessionDatabaseURL},
		{EnvHTTPListen, "http.listen", &c.HTTP.Listen},
		{EnvConsoleListen, "console.listen", &c.Console.Listen},
		{EnvLogLevel, "log.level", &c.Log.Level},
		{EnvLogFormat, "log.format", &c.Log.Format},
	} {
		if v := getenv(o.env); v != "" {
			*o.field = v
			from[o.path] = o.env
		}
	}
	return from
}

// repeatedProblem begins the problem of a key set twice in one mapping.
const repeatedProblem = "repeated:"

// decode reads data into c, rejecting unknown fields, and returns the
// problems found and, for each field path in the file, the line it is on.
// The lines are nil when data is not one YAML document.
func decode(data []byte, c *Config) ([]*FieldError, map[string]int) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, map[string]int{} // empty: every field takes its default
		}
		return []*FieldError{syntaxError(err)}, nil
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return []*FieldError{syntaxError(err)}, nil
		}
		return []*FieldError{{Line: next.Line, Problem: "a second YAML document: the configuration is one document"}}, nil
	}
	entries := index(&root)
	lines := map[string]int{}
	for _, e := range entries {
		if _, ok := lines[e.path]; !ok {
			lines[e.path] = e.line()
		}
	}

	dec = yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var problems []*FieldError
	if err := dec.Decode(c); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return []*FieldError{syntaxError(err)}, nil
		}
		for _, msg := range te.Errors {
			problems = append(problems, decodeError(msg, entries))
		}
	}
	// The providers' own fields are their types'.
	return c.types().decodeSettings(c, entries, problems), lines
}

var (
	lineRE       = regexp.MustCompile(`^line (\d+): (?:column (\d+): )?(.*)$`)
	unknownRE    = regexp.MustCompile(`^field (.+) not found in type (\S+)$`)
	unmarshalRE  = regexp.MustCompile("^cannot unmarshal (\\S+)(?: `(.*)`)? into (.+)$")
	duplicateRE  = regexp.MustCompile(`^mapping key (".*") already defined at line (\d+)$`)
	knownStructs = map[string]reflect.Type{}
)

func init() {
	for _, v := range []any{Config{}, HTTPConfig{}, LogConfig{}, DispatcherConfig{}, ProviderConfig{}, KindConfig{}, DriftConfig{}, DriftRule{}, TracingConfig{}, DatabaseConfig{}} {
		t := reflect.TypeOf(v)
		knownStructs[t.String()] = t
	}
}

// syntaxError turns a YAML parse error ("yaml: line 3: did not find
// expected key") into a problem at its line.
func syntaxError(err error) *FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := lineRE.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return &FieldError{Line: n, Problem: "invalid YAML: " + m[3]}
	}
	return &FieldError{Problem: "invalid YAML: " + msg}
}

// decodeError turns one of yaml's type errors into a problem naming the
// field, found by its line (and column, for Duration's errors) in the
// document.
func decodeError(msg string, entries []entry) *FieldError {
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return &FieldError{Problem: msg}
	}
	line, _ := strconv.Atoi(m[1])
	p := &FieldError{Line: line, Problem: m[3]}
	if m[2] != "" { // ours, from Duration.UnmarshalYAML
		col, _ := strconv.Atoi(m[2])
		if e := find(entries, func(e entry) bool { return e.val.Line == line && e.val.Column == col }); e != nil {
			p.Path = e.path
		}
		return p
	}
	if u := unknownRE.FindStringSubmatch(p.Problem); u != nil {
		p.Problem = "unknown field"
		if t, ok := knownStructs[u[2]]; ok {
			p.Problem += " (want one of " + strings.Join(fieldNames(t), ", ") + ")"
		}
		if e := find(entries, func(e entry) bool { return e.key != nil && e.key.Line == line && e.key.Value == u[1] }); e != nil {
			p.Path = e.path
		} else {
			p.Path = u[1]
		}
		return p
	}
	if d := duplicateRE.FindStringSubmatch(p.Problem); d != nil {
		key, _ := strconv.Unquote(d[1])
		p.Problem = repeatedProblem + " already set at line " + d[2]
		if e := find(entries, func(e entry) bool { return e.key != nil && e.key.Line == line && e.key.Value == key }); e != nil {
			p.Path = e.path
		}
		return p
	}
	if u := unmarshalRE.FindStringSubmatch(p.Problem); u != nil {
		tag, value, into := u[1], u[2], u[3]
		got := fmt.Sprintf("%q", value)
		switch tag {
		case "!!map":
			got = "a mapping"
		case "!!seq":
			got = "a list"
		case "!!null":
			got = "nothing"
		}
		p.Problem = "want " + describeType(into) + ", got " + got
		match := func(e entry) bool {
			if e.val.Line != line {
				return false
			}
			switch tag {
			case "!!map":
				return e.val.Kind == yaml.MappingNode
			case "!!seq":
				return e.val.Kind == yaml.SequenceNode
			}
			v, truncated := strings.CutSuffix(value, "...")
			return e.val.Kind == yaml.ScalarNode && (e.val.Value == value || truncated && strings.HasPrefix(e.val.Value, v))
		}
		if e := find(entries, match); e != nil {
			p.Path = e.path
		}
		return p
	}
	return p
}

// describeType names the Go type yaml could not decode into the way the
// file's author thinks of it.
func describeType(t string) string {
	switch {
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "bool":
		return "true or false"
	case t == "string":
		return "a string"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	}
	return "a mapping" // a struct or a map
}

// fieldNames lists the YAML names of a struct's fields.
func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			names = append(names, name)
		}
	}
	return names
}

// entry is one value in the document: a mapping's value under its key, or
// a list's item.
type entry struct {
	path string
	key  *yaml.Node // nil for a list item
	val  *yaml.Node
}

func (e entry) line() int {
	if e.key != nil {
		return e.key.Line
	}
	return e.val.Line
}

func find(entries []entry, match func(entry) bool) *entry {
	for i := range entries {
		if match(entries[i]) {
			return &entries[i]
		}
	}
	return nil
}

// index lists every value in the document with its field path.
func index(root *yaml.Node) []entry {
	var entries []entry
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				walk(c, path)
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := childPath(path, k.Value)
				entries = append(entries, entry{path: p, key: k, val: v})
				walk(v, p)
			}
		case yaml.SequenceNode:
			for i, v := range n.Content {
				p := path + "[" + strconv.Itoa(i) + "]"
				entries = append(entries, entry{path: p, val: v})
				walk(v, p)
			}
		}
	}
	walk(root, "")
	return entries
}

// childPath is the path of the field key under path. The keys of the maps
// whose keys are names (providers, kinds, headers, headers_env) are quoted
// in brackets,
// since they may hold dots: kinds["charge.create"].
func childPath(path, key string) string {
	switch {
	case path == "":
		return key
	case path == "providers" || path == "kinds" || strings.HasSuffix(path, ".headers") || strings.HasSuffix(path, ".headers_env"):
		return path + "[" + strconv.Quote(key) + "]"
	}
	return path + "." + key
}

// within reports whether path is field or a field inside it.
func within(path, field string) bool {
	if !strings.HasPrefix(path, field) {
		return false
	}
	rest := path[len(field):]
	return rest == "" || rest[0] == '.' || rest[0] == '['
}

// lineOf returns the line of path in the file or, for a field the file
// does not set, of the nearest enclosing field it does set; 0 if none.
func lineOf(lines map[string]int, path string) int {
	for path != "" {
		if n, ok := lines[path]; ok {
			return n
		}
		path = parentPath(path)
	}
	return 0
}

// parentPath drops the last field of path: kinds["a.b"].timeout →
// kinds["a.b"] → kinds.
func parentPath(path string) string {
	if strings.HasSuffix(path, "]") {
		// The bracket that opens the last index: quoted keys may hold "[".
		if i := strings.LastIndex(path, `["`); i >= 0 && strings.HasSuffix(path, `"]`) {
			if _, err := strconv.Unquote(path[i+1 : len(path)-1]); err == nil {
				return path[:i]
			}
		}
		if i := strings.LastIndexByte(path, '['); i >= 0 {
			return path[:i]
		}
	}
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		return path[:i]
	}
	return ""
}
