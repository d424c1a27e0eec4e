package drift

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// Alert is one alert in Alertmanager's /api/v2/alerts format.
type Alert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations"`
	StartsAt     time.Time         `json:"startsAt"`
	EndsAt       time.Time         `json:"endsAt,omitzero"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
}

// alerter posts firing alerts for non-zero findings and for failed or
// refused rules, or rules with a problem, on every run (as Alertmanager expects active alerts to be
// re-sent) and a resolved alert once a firing one goes back to zero.
type alerter struct {
	url    string
	client *http.Client
	log    *slog.Logger
	mu     sync.Mutex
	firing map[string]Alert // by fingerprint
}

func newAlerter(url string, log *slog.Logger) *alerter {
	return &alerter{url: url, client: &http.Client{Timeout: 10 * time.Second}, log: log, firing: map[string]Alert{}}
}

func fingerprint(labels map[string]string) string {
	return labels["alertname"] + "|" + labels["rule"] + "|" + labels["reason"]
}

// alertsFor turns a report into the alerts that fire now.
func alertsFor(rep Report, now time.Time) []Alert {
	host, _ := os.Hostname()
	var out []Alert
	add := func(name, severity string, labels map[string]string, summary, desc string) {
		l := map[string]string{"alertname": name, "service": "sidefx", "severity": severity, "instance": host}
		for k, v := range labels {
			l[k] = v
		}
		out = append(out, Alert{Labels: l, Annotations: map[string]string{"summary": summary, "description": desc}, StartsAt: now})
	}
	for _, f := range rep.Findings {
		if f.Err != nil {
			what := "failed"
			if f.Refused {
				what = "was refused at start and does not run"
			}
			add("SidefxDriftRunErrors", "ticket", map[string]string{"rule": f.Rule, "kind": f.Kind},
				fmt.Sprintf("drift rule %s %s", f.Rule, what),
				fmt.Sprintf("%v; its findings are missing until the rule is fixed", f.Err))
		} else if f.Problem != "" {
			add("SidefxDriftRunErrors", "ticket", map[string]string{"rule": f.Rule, "kind": f.Kind},
				fmt.Sprintf("drift rule %s has a problem", f.Rule),
				fmt.Sprintf("%s; its other findings stand", f.Problem))
		}
		if f.Missing > 0 {
			add("SidefxDriftMissing", "page", map[string]string{"rule": f.Rule, "kind": f.Kind},
				fmt.Sprintf("%d sources lack their %s effect", f.Missing, f.Kind),
				fmt.Sprintf("drift rule %s: %d expected sources have no %s effect, e.g. %s", f.Rule, f.Missing, f.Kind, strings.Join(f.MissingIDs, ", ")))
		}
		if f.Extra > 0 {
			add("SidefxDriftExtra", "page", map[string]string{"rule": f.Rule, "kind": f.Kind},
				fmt.Sprintf("%d %s effects have no expected source", f.Extra, f.Kind),
				fmt.Sprintf("drift rule %s: %d %s effects are for sources the rule does not expect, e.g. %s", f.Rule, f.Extra, f.Kind, strings.Join(f.ExtraIDs, ", ")))
		}
	}
	if rep.StuckErr == nil {
		for reason, n := range rep.Stuck.Reasons() {
			if n > 0 {
				add("SidefxEffectsStuck", "ticket", map[string]string{"reason": reason},
					fmt.Sprintf("%d effects stuck: %s", n, reason),
					fmt.Sprintf("%d effects are %s; see sidefx status and sidefx inspect", n, strings.ReplaceAll(reason, "_", " ")))
			}
		}
	}
	return out
}

func (a *alerter) notify(ctx context.Context, rep Report) {
	now := time.Now().UTC()
	fire := alertsFor(rep, now)
	a.mu.Lock()
	current := map[string]Alert{}
	for _, al := range fire {
		fp := fingerprint(al.Labels)
		if prev, ok := a.firing[fp]; ok {
			al.StartsAt = prev.StartsAt // the same alert, still firing
		}
		current[fp] = al
	}
	var send []Alert
	for _, al := range current {
		send = append(send, al)
	}
	for fp, al := range a.firing {
		if _, still := current[fp]; !still {
			al.EndsAt = now
			send = append(send, al)
		}
	}
	a.firing = current
	a.mu.Unlock()
	if len(send) == 0 {
		return
	}
	body, _ := json.Marshal(send)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		a.log.Error("drift alert", "err", err)
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		a.log.Error("drift alert not delivered", "err", err)
		return
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		a.log.Error("drift alert refused", "status", resp.Status)
	}
}
