// Package deploy holds sidefx's operations assets; it has no Go API.
//
//   - grafana/sidefx.json: the Grafana dashboard;
//   - prometheus/alerts.yaml: the Prometheus alerting rules, with their unit
//     tests in prometheus/alerts_test.yaml (promtool's format);
//   - rulecheck/: a separate Go module that checks the rules and the
//     dashboard's PromQL with Prometheus's own parser and rule engine, so
//     that Prometheus stays out of the main module's go.mod;
//   - package/: the .deb and .rpm that make release builds (nfpm.yaml, the
//     systemd unit, the default configuration, the install scripts);
//   - container/Dockerfile: the daemon's image;
//   - kubernetes/: the daemon's manifests, with the rules and the
//     dashboard generated into a PrometheusRule and a ConfigMap.
//
// This package's test checks that the dashboard and the rules name only
// metrics the daemon exports (internal/metrics: the dispatcher's, the
// table's, the drift job's, the reconciler's and the provider events') or a
// user's service exports through inbox/inboxmetrics and edge/edgemetrics,
// that the dashboard shows every one of them, and that no expression
// filters the service's metrics by job; that the Kubernetes manifests
// parse, agree with the daemon (probes, ports, a valid configuration) and
// carry the rules and dashboard unchanged; that the Dockerfile's image is
// static and not root; and, under make test-release only, that the
// release's .deb installs and works (release_test.go). README.md says how to import
// the dashboard and load the rules, and what to do when an alert fires.
package deploy
