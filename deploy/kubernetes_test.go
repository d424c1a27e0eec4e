package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/daemon"
	"github.com/sidefx/sidefx/internal/lab/pgtest"
	"github.com/sidefx/sidefx/providers/builtin"
)

var update = flag.Bool("update", false, "rewrite deploy/kubernetes's generated manifests")

// The manifests generated from the files they carry, and how.
var generated = map[string]func() ([]byte, error){
	"kubernetes/prometheusrule.yaml":    prometheusRule,
	"kubernetes/grafana-dashboard.yaml": dashboardConfigMap,
}

// prometheusRule is prometheus/alerts.yaml as a PrometheusRule: its groups
// under spec, line for line.
func prometheusRule() ([]byte, error) {
	rules, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.WriteString(`# Generated from deploy/prometheus/alerts.yaml by
# go test ./deploy -run TestKubernetesGenerated -update: do not edit.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: sidefx
  labels:
    app.kubernetes.io/name: sidefx
spec:
`)
	indent(&b, rules, "  ")
	return b.Bytes(), nil
}

// dashboardConfigMap is grafana/sidefx.json in a ConfigMap that Grafana's
// dashboard sidecar loads (label grafana_dashboard).
func dashboardConfigMap() ([]byte, error) {
	dash, err := os.ReadFile("grafana/sidefx.json")
	if err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(dash, []byte("\n")) || bytes.HasSuffix(dash, []byte("\n\n")) {
		return nil, errors.New("grafana/sidefx.json does not end in exactly one newline: a YAML block scalar would change it")
	}
	var b bytes.Buffer
	b.WriteString(`# Generated from deploy/grafana/sidefx.json by
# go test ./deploy -run TestKubernetesGenerated -update: do not edit.
apiVersion: v1
kind: ConfigMap
metadata:
  name: sidefx-dashboard
  labels:
    app.kubernetes.io/name: sidefx
    grafana_dashboard: "1"
data:
  sidefx.json: |
`)
	indent(&b, dash, "    ")
	return b.Bytes(), nil
}

func indent(b *bytes.Buffer, text []byte, prefix string) {
	for line := range strings.Lines(string(text)) {
		if strings.TrimSpace(line) != "" {
			b.WriteString(prefix)
		}
		b.WriteString(line)
	}
}

// TestKubernetesGenerated: the PrometheusRule and the dashboard's
// ConfigMap are what the generators make of alerts.yaml and sidefx.json
// now (-update rewrites them), and, read back as Kubernetes reads them,
// hold the same groups and the same bytes.
func TestKubernetesGenerated(t *testing.T) {
	for _, file := range slices.Sorted(maps.Keys(generated)) {
		want, err := generated[file]()
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			if err := os.WriteFile(file, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got := read(t, file); !bytes.Equal(got, want) {
			t.Errorf("%s is not generated from what it carries now: go test ./deploy -run TestKubernetesGenerated -update", file)
		}
	}
	for _, p := range checkPrometheusRule(read(t, "kubernetes/prometheusrule.yaml"), read(t, "prometheus/alerts.yaml")) {
		t.Error(p)
	}
	for _, p := range checkDashboardConfigMap(read(t, "kubernetes/grafana-dashboard.yaml"), read(t, "grafana/sidefx.json")) {
		t.Error(p)
	}
}

// checkPrometheusRule returns what is wrong with a PrometheusRule made of
// a rule file: not one, or groups that are not the file's.
func checkPrometheusRule(manifest, alerts []byte) []string {
	var rule struct {
		APIVersion string `yaml:"apiVersion"`
		Kind       string `yaml:"kind"`
		Spec       struct {
			Groups any `yaml:"groups"`
		} `yaml:"spec"`
	}
	var file struct {
		Groups any `yaml:"groups"`
	}
	if err := yaml.Unmarshal(manifest, &rule); err != nil {
		return []string{"prometheusrule.yaml: " + err.Error()}
	}
	if err := yaml.Unmarshal(alerts, &file); err != nil {
		return []string{"alerts.yaml: " + err.Error()}
	}
	var problems []string
	if rule.APIVersion != "monitoring.coreos.com/v1" || rule.Kind != "PrometheusRule" {
		problems = append(problems, fmt.Sprintf("prometheusrule.yaml is a %s %s", rule.APIVersion, rule.Kind))
	}
	if file.Groups == nil || !reflect.DeepEqual(rule.Spec.Groups, file.Groups) {
		problems = append(problems, "prometheusrule.yaml's spec.groups are not alerts.yaml's groups")
	}
	return problems
}

// checkDashboardConfigMap returns what is wrong with the dashboard's
// ConfigMap: not one Grafana's sidecar loads, or not the dashboard's bytes.
func checkDashboardConfigMap(manifest, dash []byte) []string {
	var cm struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(manifest, &cm); err != nil {
		return []string{"grafana-dashboard.yaml: " + err.Error()}
	}
	var problems []string
	if cm.Kind != "ConfigMap" || cm.Metadata.Labels["grafana_dashboard"] == "" {
		problems = append(problems, fmt.Sprintf("grafana-dashboard.yaml: a %s labelled %v, want a ConfigMap labelled grafana_dashboard", cm.Kind, cm.Metadata.Labels))
	}
	if cm.Data["sidefx.json"] != string(dash) {
		problems = append(problems, "grafana-dashboard.yaml's sidefx.json is not grafana/sidefx.json")
	}
	return problems
}

// TestKubernetesGeneratedDrift shows the checks bite: a rule changed in
// the manifest only, and a dashboard a byte off, fail.
func TestKubernetesGeneratedDrift(t *testing.T) {
	alerts, dash := read(t, "prometheus/alerts.yaml"), read(t, "grafana/sidefx.json")
	rule, err := prometheusRule()
	if err != nil {
		t.Fatal(err)
	}
	cm, err := dashboardConfigMap()
	if err != nil {
		t.Fatal(err)
	}
	if p := checkPrometheusRule(rule, alerts); len(p) > 0 {
		t.Errorf("the generated rule fails: %v", p)
	}
	if p := checkDashboardConfigMap(cm, dash); len(p) > 0 {
		t.Errorf("the generated dashboard fails: %v", p)
	}
	if p := checkPrometheusRule(bytes.Replace(rule, []byte("for: "), []byte("for: 1"), 1), alerts); len(p) == 0 {
		t.Error("a rule changed in the manifest only passes")
	}
	if p := checkDashboardConfigMap(bytes.Replace(cm, []byte(`"uid"`), []byte(`"uid" `), 1), dash); len(p) == 0 {
		t.Error("a dashboard a byte off passes")
	}
}

// k8s is the part of a manifest the checks read.
type k8s struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		Template struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec podSpec `yaml:"spec"`
		} `yaml:"template"`
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort any    `yaml:"targetPort"`
		} `yaml:"ports"`
		Endpoints []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
	} `yaml:"spec"`
}

type podSpec struct {
	SecurityContext struct {
		RunAsNonRoot bool  `yaml:"runAsNonRoot"`
		RunAsUser    int64 `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Env   []struct {
		Name  string `yaml:"name"`
		Value string `yaml:"value"`
	} `yaml:"env"`
	EnvFrom []struct {
		SecretRef *struct {
			Name string `yaml:"name"`
		} `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	VolumeMounts   []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
	SecurityContext struct {
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
	} `yaml:"securityContext"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"`
	} `yaml:"httpGet"`
}

// manifests parses every file in kubernetes/, each document of each, and
// checks that each is a Kubernetes object with a name and that
// kustomization.yaml lists every other file.
func manifests(t *testing.T) map[string]k8s {
	t.Helper()
	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in kubernetes/ (%v)", err)
	}
	objs := map[string]k8s{} // by kind/name
	var listed []string
	for _, f := range files {
		dec := yaml.NewDecoder(bytes.NewReader(read(t, f)))
		for n := 0; ; n++ {
			var node yaml.Node
			err := dec.Decode(&node)
			if errors.Is(err, io.EOF) {
				if n == 0 {
					t.Errorf("%s: no document", f)
				}
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if path.Base(f) == "kustomization.yaml" {
				var k struct {
					Resources []string `yaml:"resources"`
				}
				if err := node.Decode(&k); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				listed = k.Resources
				continue
			}
			var o k8s
			if err := node.Decode(&o); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
				t.Errorf("%s document %d: apiVersion %q, kind %q, name %q: want all three", f, n, o.APIVersion, o.Kind, o.Metadata.Name)
			}
			key := o.Kind + "/" + o.Metadata.Name
			if _, dup := objs[key]; dup {
				t.Errorf("%s: %s twice", f, key)
			}
			objs[key] = o
		}
	}
	var want []string
	for _, f := range files {
		if b := path.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	if slices.Sort(listed); !slices.Equal(listed, want) {
		t.Errorf("kustomization.yaml lists %v, want every manifest: %v", listed, want)
	}
	return objs
}

func object(t *testing.T, objs map[string]k8s, key string) k8s {
	t.Helper()
	o, ok := objs[key]
	if !ok {
		t.Fatalf("no %s in kubernetes/", key)
	}
	return o
}

// containerPort resolves a probe's or a Service's port, a number or a
// container port's name.
func containerPort(c container, port any) (int, bool) {
	switch p := port.(type) {
	case int:
		return p, slices.ContainsFunc(c.Ports, func(cp struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
		}) bool {
			return cp.ContainerPort == p
		})
	case string:
		for _, cp := range c.Ports {
			if cp.Name == p {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

func env(c container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func secretRefs(c container) []string {
	var out []string
	for _, e := range c.EnvFrom {
		if e.SecretRef != nil {
			out = append(out, e.SecretRef.Name)
		}
	}
	return out
}

// configOf returns the path the container's args give --config, and the
// configuration the ConfigMap mounted there holds.
func configOf(t *testing.T, objs map[string]k8s, pod podSpec, c container) (string, string) {
	t.Helper()
	i := slices.Index(c.Args, "--config")
	if i < 0 || i+1 >= len(c.Args) {
		t.Fatalf("container %s: args %v give no --config", c.Name, c.Args)
	}
	file := c.Args[i+1]
	for _, m := range c.VolumeMounts {
		if path.Join(m.MountPath, path.Base(file)) != file {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				cm := object(t, objs, "ConfigMap/"+v.ConfigMap.Name)
				data, ok := cm.Data[path.Base(file)]
				if !ok {
					t.Fatalf("ConfigMap %s has no %s", cm.Metadata.Name, path.Base(file))
				}
				return file, data
			}
		}
	}
	t.Fatalf("container %s: no ConfigMap mounted at %s", c.Name, path.Dir(file))
	return "", ""
}

// TestKubernetesManifests: every manifest parses; the Deployment's
// daemon listens on every interface on the daemon's port (9464, the
// default of http.listen), its container port and its probes' ports are
// that one, and its probes are /healthz and /readyz; the Service, the
// ServiceMonitor and the PodDisruptionBudget find its pods and port; the
// migration Job runs sidefx migrate with a Secret of its own (the schema's
// owner), not the daemon's; the configuration the ConfigMap holds passes
// sidefx's validator; no container runs as root or can gain privileges.
func TestKubernetesManifests(t *testing.T) {
	objs := manifests(t)
	dep := object(t, objs, "Deployment/sidefx")
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment: %d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Errorf("Deployment: args %v, want run --config …", c.Args)
	}
	_, defaultPort, _ := net.SplitHostPort(config.DefaultListen)
	listen := env(c, config.EnvHTTPListen)
	host, port, err := net.SplitHostPort(listen)
	if err != nil || host != "0.0.0.0" || port != defaultPort {
		t.Errorf("Deployment: %s=%q, want 0.0.0.0:%s (every interface of the pod, the daemon's port)", config.EnvHTTPListen, listen, defaultPort)
	}
	p, _ := strconv.Atoi(port)
	if got, ok := containerPort(c, "http"); !ok || got != p {
		t.Errorf("Deployment: container port http is %d, want %d", got, p)
	}
	for name, pr := range map[string]struct {
		probe *probe
		path  string
	}{"liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("Deployment: no HTTP %s probe", name)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path {
			t.Errorf("Deployment: %s probe on %s, want %s", name, pr.probe.HTTPGet.Path, pr.path)
		}
		if got, ok := containerPort(c, pr.probe.HTTPGet.Port); !ok || got != p {
			t.Errorf("Deployment: %s probe on port %v (%d), want the daemon's %d", name, pr.probe.HTTPGet.Port, got, p)
		}
	}
	if !maps.Equal(dep.Spec.Selector.MatchLabels, subset(dep.Spec.Template.Metadata.Labels, dep.Spec.Selector.MatchLabels)) {
		t.Errorf("Deployment: selector %v does not match its pods' labels %v", dep.Spec.Selector.MatchLabels, dep.Spec.Template.Metadata.Labels)
	}
	pods := dep.Spec.Template.Metadata.Labels

	svc := object(t, objs, "Service/sidefx")
	if !selects(svcSelector(t), pods) {
		t.Errorf("Service: selects no daemon pod")
	}
	var svcPort string
	for _, sp := range svc.Spec.Ports {
		if got, ok := containerPort(c, sp.TargetPort); ok && got == p {
			svcPort = sp.Name
		}
	}
	if svcPort == "" {
		t.Errorf("Service: no port targets the daemon's %d", p)
	}
	sm := object(t, objs, "ServiceMonitor/sidefx")
	if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != svcPort || sm.Spec.Endpoints[0].Path != "/metrics" {
		t.Errorf("ServiceMonitor: endpoints %+v, want /metrics on the Service's port %q", sm.Spec.Endpoints, svcPort)
	}
	if !selects(sm.Spec.Selector.MatchLabels, svc.Metadata.Labels) {
		t.Errorf("ServiceMonitor: selects no Service labelled %v", svc.Metadata.Labels)
	}
	pdb := object(t, objs, "PodDisruptionBudget/sidefx")
	if !selects(pdb.Spec.Selector.MatchLabels, pods) {
		t.Errorf("PodDisruptionBudget: selector %v matches no daemon pod", pdb.Spec.Selector.MatchLabels)
	}

	job := object(t, objs, "Job/sidefx-migrate")
	jpod := job.Spec.Template.Spec
	if len(jpod.Containers) != 1 || len(jpod.Containers[0].Args) == 0 || jpod.Containers[0].Args[0] != "migrate" {
		t.Fatalf("Job sidefx-migrate: want one container running sidefx migrate")
	}
	jc := jpod.Containers[0]
	if jc.Image != c.Image {
		t.Errorf("Job: image %q, the daemon's %q: the migrations are the release's", jc.Image, c.Image)
	}
	if d, j := secretRefs(c), secretRefs(jc); len(d) == 0 || len(j) == 0 || slices.ContainsFunc(j, func(s string) bool { return slices.Contains(d, s) }) {
		t.Errorf("Secrets: the daemon's %v, the migration's %v: want one each, not shared (the owner's credentials are not the daemon's)", d, j)
	}
	if selects(pdb.Spec.Selector.MatchLabels, job.Spec.Template.Metadata.Labels) || selects(svcSelector(t), job.Spec.Template.Metadata.Labels) {
		t.Errorf("the migration's pod is selected as a daemon")
	}

	for _, pc := range []struct {
		name string
		pod  podSpec
		c    container
	}{{"Deployment", pod, c}, {"Job", jpod, jc}} {
		if !pc.pod.SecurityContext.RunAsNonRoot || pc.pod.SecurityContext.RunAsUser == 0 {
			t.Errorf("%s: runAsNonRoot %v, runAsUser %d: want a user that is not root", pc.name, pc.pod.SecurityContext.RunAsNonRoot, pc.pod.SecurityContext.RunAsUser)
		}
		if e := pc.c.SecurityContext.AllowPrivilegeEscalation; e == nil || *e || !pc.c.SecurityContext.ReadOnlyRootFilesystem {
			t.Errorf("%s: want allowPrivilegeEscalation false and readOnlyRootFilesystem", pc.name)
		}
		_, cfg := configOf(t, objs, pc.pod, pc.c)
		env := map[string]string{config.EnvDatabaseURL: "postgres://sidefx@db.example:5432/app"}
		for _, e := range pc.c.Env {
			env[e.Name] = e.Value
		}
		if _, err := config.Parse([]byte(cfg), func(k string) string { return env[k] }, builtin.Types()...); err != nil {
			t.Errorf("%s: the ConfigMap's configuration is refused:\n%v", pc.name, err)
		}
	}
}

func svcSelector(t *testing.T) map[string]string {
	t.Helper()
	var s struct {
		Spec struct {
			Selector map[string]string `yaml:"selector"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(read(t, "kubernetes/service.yaml"), &s); err != nil {
		t.Fatal(err)
	}
	return s.Spec.Selector
}

// selects reports whether a non-empty selector matches labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func subset(labels, keys map[string]string) map[string]string {
	out := map[string]string{}
	for k := range keys {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}

// TestKubernetesProbesServed runs the daemon, in this process, on the
// ConfigMap's configuration and the Deployment's environment (its listen
// address moved to a free port on loopback), against a migrated database,
// and asks it what the probes ask: the liveness path answers 200 at once,
// the readiness path 200 once it runs.
func TestKubernetesProbesServed(t *testing.T) {
	objs := manifests(t)
	dep := object(t, objs, "Deployment/sidefx")
	pod := dep.Spec.Template.Spec
	c := pod.Containers[0]
	file, cfg := configOf(t, objs, pod, c)

	dir := t.TempDir()
	cfgPath := filepath.Join(dir, path.Base(file))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	env := map[string]string{
		config.EnvDatabaseURL: pgtest.URL(t),
		// The example webhook provider's signing secret.
		"SIDEFX_EXAMPLE_WEBHOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw==",
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	env[config.EnvHTTPListen] = addr
	args := slices.Clone(c.Args)
	args[slices.Index(args, "--config")+1] = cfgPath

	ctx, cancel := context.WithCancel(context.Background())
	logs := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- daemon.Run(ctx, args, &daemon.IO{Out: io.Discard, Err: logs, Getenv: func(k string) string { return env[k] }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sidefx run: %v", err)
		}
		if t.Failed() {
			t.Logf("the daemon's log:\n%s", logs.String())
		}
	})

	get := func(p string) (int, string) {
		resp, err := http.Get("http://" + addr + p)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, 30*time.Second, func() (bool, string) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("sidefx run ended: %v", err)
		default:
		}
		code, body := get(c.LivenessProbe.HTTPGet.Path)
		return code == http.StatusOK, fmt.Sprintf("liveness %s: %d %s", c.LivenessProbe.HTTPGet.Path, code, body)
	})
	waitFor(t, 30*time.Second, func() (bool, string) {
		code, body := get(c.ReadinessProbe.HTTPGet.Path)
		return code == http.StatusOK, fmt.Sprintf("readiness %s: %d %s", c.ReadinessProbe.HTTPGet.Path, code, body)
	})
	if code, _ := get("/no-such-path"); code != http.StatusNotFound {
		t.Errorf("an unknown path answers %d, not 404: the probes' answers prove nothing", code)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, state)
		}
		<-tick.C
	}
}

// lockedBuffer is a bytes.Buffer the daemon's goroutines write to while
// the test may read it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
