package deploy_test

import (
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
)

// instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case: FROM, RUN, USER...
	args string
}

// stage is a build stage: its FROM's image and name, and its instructions.
type stage struct {
	image, name string
	ins         []instruction
}

func parseDockerfile(text string) ([]stage, error) {
	var stages []stage
	var cur strings.Builder
	start := 0
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		trimmed := strings.TrimSpace(l)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		} else if strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if s, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		cur.Reset()
		in := instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{image: f[0]}
			for f = f[1:]; len(f) > 0 && strings.HasPrefix(f[0], "--"); f = f[1:] {
			}
			if len(f) == 2 && strings.EqualFold(f[0], "AS") {
				st.name = f[1]
			}
			stages = append(stages, st)
			continue
		}
		if len(stages) == 0 {
			if in.cmd == "ARG" {
				continue
			}
			return nil, fmt.Errorf("line %d: %s before FROM", in.line, in.cmd)
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("line %d: a continuation never ends", start)
	}
	return stages, nil
}

func (s stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// checkDockerfile returns what is wrong with the image a Dockerfile
// makes: the final stage must start from distroless static or scratch
// (no shell, no libc), run as a user that is not root (USER, the last
// one, by a number or a name other than root), copy its binary from a
// build stage that builds it with CGO_ENABLED=0, start it in exec form
// with sidefx run, listen on every interface on the daemon's port and
// expose that port.
func checkDockerfile(text string) []string {
	stages, err := parseDockerfile(text)
	if err != nil {
		return []string{err.Error()}
	}
	if len(stages) < 2 {
		return []string{fmt.Sprintf("%d stages, want a build stage and a final one", len(stages))}
	}
	var problems []string
	bad := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	final := stages[len(stages)-1]
	if !strings.HasPrefix(final.image, "gcr.io/distroless/static") && final.image != "scratch" {
		bad("final stage FROM %s: want gcr.io/distroless/static… or scratch (no shell, no libc)", final.image)
	}
	if len(final.all("RUN")) > 0 {
		bad("final stage has RUN: it has no shell to run it")
	}
	users := final.all("USER")
	switch {
	case len(users) == 0:
		bad("final stage sets no USER: it would run as root")
	default:
		u, _, _ := strings.Cut(users[len(users)-1].args, ":")
		if u == "root" || strings.Trim(u, "0") == "" {
			bad("final stage USER %s: root", users[len(users)-1].args)
		}
	}
	// The binary comes from a build stage that builds it static.
	var from string
	for _, c := range final.all("COPY") {
		if m := regexp.MustCompile(`--from=(\S+)\s+\S+\s+/usr/bin/sidefx$`).FindStringSubmatch(c.args); m != nil {
			from = m[1]
		}
	}
	i := slices.IndexFunc(stages, func(s stage) bool { return s.name == from })
	if from == "" || i < 0 || i == len(stages)-1 {
		bad("final stage copies /usr/bin/sidefx from no build stage (COPY --from=%q)", from)
	} else {
		static := false
		for _, r := range stages[i].all("RUN") {
			if regexp.MustCompile(`(^|\s)CGO_ENABLED=0\s+go build\s.*\./cmd/sidefx`).MatchString(r.args) {
				static = true
			}
		}
		if !static {
			bad("build stage %s does not build ./cmd/sidefx with CGO_ENABLED=0 go build: the binary would not be static", from)
		}
	}
	ep := final.all("ENTRYPOINT")
	var entry, cmd []string
	if len(ep) == 0 || json.Unmarshal([]byte(ep[len(ep)-1].args), &entry) != nil || !slices.Equal(entry, []string{"/usr/bin/sidefx"}) {
		bad("ENTRYPOINT: want [\"/usr/bin/sidefx\"], in exec form (no shell)")
	}
	if c := final.all("CMD"); len(c) == 0 || json.Unmarshal([]byte(c[len(c)-1].args), &cmd) != nil || len(cmd) == 0 || cmd[0] != "run" {
		bad("CMD: want [\"run\", …] in exec form")
	}
	_, port, _ := net.SplitHostPort(config.DefaultListen)
	listen := ""
	for _, e := range final.all("ENV") {
		if v, ok := strings.CutPrefix(e.args, config.EnvHTTPListen+"="); ok {
			listen = v
		}
	}
	if listen != "0.0.0.0:"+port {
		bad("final stage ENV %s=%q, want 0.0.0.0:%s: loopback is unreachable from outside a container", config.EnvHTTPListen, listen, port)
	}
	exposed := false
	for _, e := range final.all("EXPOSE") {
		for _, p := range strings.Fields(e.args) {
			if strings.TrimSuffix(p, "/tcp") == port {
				exposed = true
			}
		}
	}
	if !exposed {
		bad("final stage does not EXPOSE %s, the daemon's port", port)
	}
	return problems
}

// TestDockerfile: deploy/container/Dockerfile's image is static, has no
// shell, runs sidefx as a user that is not root and serves on the daemon's
// port. Docker's daemon is not available to the tests: the file is read,
// not built.
func TestDockerfile(t *testing.T) {
	for _, p := range checkDockerfile(string(read(t, "container/Dockerfile"))) {
		t.Errorf("container/Dockerfile: %s", p)
	}
}

// TestDockerfileChecksBite: each kind of mistake fails.
func TestDockerfileChecksBite(t *testing.T) {
	good := string(read(t, "container/Dockerfile"))
	if p := checkDockerfile(good); len(p) > 0 {
		t.Fatalf("the shipped Dockerfile fails: %v", p)
	}
	for name, c := range map[string]struct{ old, new, want string }{
		"root":          {"USER 65532:65532", "USER 0:0", "root"},
		"root by name":  {"USER 65532:65532", "USER root", "root"},
		"no user":       {"USER 65532:65532\n", "", "no USER"},
		"debian final":  {"FROM gcr.io/distroless/static-debian12:nonroot", "FROM debian:bookworm-slim", "want gcr.io/distroless"},
		"cgo":           {"CGO_ENABLED=0 go build", "go build", "not be static"},
		"shell form":    {`ENTRYPOINT ["/usr/bin/sidefx"]`, "ENTRYPOINT /usr/bin/sidefx", "exec form"},
		"loopback":      {"SIDEFX_HTTP_LISTEN=0.0.0.0:9464", "SIDEFX_HTTP_LISTEN=127.0.0.1:9464", "loopback"},
		"not exposed":   {"EXPOSE 9464", "EXPOSE 8080", "does not EXPOSE"},
		"wrong stage":   {"COPY --from=build", "COPY --from=builder", "from no build stage"},
		"run in final":  {"COPY --from=build /out/sidefx /usr/bin/sidefx", "COPY --from=build /out/sidefx /usr/bin/sidefx\nRUN chmod 755 /usr/bin/sidefx", "has RUN"},
		"single stage":  {"FROM gcr.io/distroless/static-debian12:nonroot\n", "", "stages"},
		"open continue": {"./cmd/sidefx\n", "./cmd/sidefx \\", "never ends"},
	} {
		if !strings.Contains(good, c.old) {
			t.Fatalf("%s: the Dockerfile has no %q", name, c.old)
		}
		broken := strings.Replace(good, c.old, c.new, 1)
		if name == "open continue" {
			broken = good[:strings.LastIndex(good, "\n")] + ` \`
		}
		p := checkDockerfile(broken)
		if !slices.ContainsFunc(p, func(s string) bool { return strings.Contains(s, c.want) }) {
			t.Errorf("%s: problems %v, want one saying %q", name, p, c.want)
		}
	}
}
