package scenario

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The secrets of the secrets scenario: each must appear nowhere sidefx
// writes. All are URL-safe, so an echoed URL holds them as they are.
const (
	hookUser         = "hookuser"
	userinfoPassword = "userinfoPASSsecret2468"
	queryToken       = "queryTOKENsecret13579"
	headerToken      = "headerTOKENsecret0123456789"
	bearerToken      = "bearerTOKENsecret987654"
	partnerSignKey   = "scenario-partner-signing-key-32b" // 32 bytes
	bearerSignKey    = "scenario-bearers-signing-key-32b"
)

// No echoed secret is stored, printed or logged. Two webhook endpoints at a
// receiver that echoes every request back (headers, the URL with its query
// and user information, the body) in every answer, 401s included: one
// authenticated by URL user information, a query token and a secret header,
// the other by "Authorization: Bearer" and a query token. Charges go to the
// Stripe peer through the proxy, some answers lost, some stored 500s.
// Nothing in the database (every table, every column), in `sidefx inspect`
// and `sidefx status`, in any command's error output or in the daemon's
// debug logs holds the Stripe key, a signing secret, the header tokens, the
// query tokens or the user information's password.
func TestScenario_NoEchoedSecretIsStoredPrintedOrLogged(t *testing.T) {
	t.Parallel()
	w := setup(t, Cycle(Pass, Pass, LoseAnswer, Stored500))
	rcv, err := NewEchoReceiver(UnauthorizedEvery(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rcv.Close(); err != nil {
			t.Errorf("echo receiver: %v", err)
		}
	})
	partnerSecret := "whsec_" + base64.StdEncoding.EncodeToString([]byte(partnerSignKey))
	bearerSecret := "whsec_" + base64.StdEncoding.EncodeToString([]byte(bearerSignKey))
	w.env = append(w.env, "SCENARIO_PARTNER_SECRET="+partnerSecret, "SCENARIO_BEARER_SECRET="+bearerSecret)
	host := strings.TrimPrefix(rcv.URL, "http://")
	partnerURL := fmt.Sprintf("http://%s:%s@%s/hooks/partner?token=%s&tenant=t1", hookUser, userinfoPassword, host, queryToken)
	bearerURL := fmt.Sprintf("%s/hooks/bearer?token=%s", rcv.URL, queryToken)
	w.writeConfig(config{
		dispatcher: "workers: 4, batch_size: 20, lease: 5s, poll_interval: 50ms, rescue_interval: 1s, shutdown_timeout: 5s",
		charge:     "max_attempts: 3, timeout: 2s, backoff_base: 50ms, backoff_max: 100ms",
		providers: fmt.Sprintf(`  partner:
    type: webhook
    url: %q
    secret_env: SCENARIO_PARTNER_SECRET
    timeout: 2s
    headers: {X-Partner-Token: %q}
  bearer:
    type: webhook
    url: %q
    secret_env: SCENARIO_BEARER_SECRET
    timeout: 2s
    headers: {Authorization: %q}
`, partnerURL, headerToken, bearerURL, "Bearer "+bearerToken),
		kinds: `  webhook.partner: {provider: partner, max_attempts: 2, timeout: 2s, backoff_base: 50ms, backoff_max: 100ms}
  webhook.bearer: {provider: bearer, max_attempts: 2, timeout: 2s, backoff_base: 50ms, backoff_max: 100ms}
`,
	})
	secrets := map[string]string{
		"the Stripe API key":                  stripeKey,
		"the partner signing secret":          partnerSecret,
		"the partner signing secret's base64": strings.TrimPrefix(partnerSecret, "whsec_"),
		"the partner signing key":             partnerSignKey,
		"the bearer signing secret":           bearerSecret,
		"the bearer signing secret's base64":  strings.TrimPrefix(bearerSecret, "whsec_"),
		"the bearer signing key":              bearerSignKey,
		"the secret header's token":           headerToken,
		"the Authorization bearer token":      bearerToken,
		"the query token":                     queryToken,
		"the URL's user information password": userinfoPassword,
		"the URL's user information as basic auth": base64.StdEncoding.EncodeToString(
			[]byte(hookUser + ":" + userinfoPassword)),
	}

	charges, _ := w.enqueueCharges("order-e", 4)
	var hooks []string
	for i := range 6 {
		for _, kind := range []string{"webhook.partner", "webhook.bearer"} {
			src := fmt.Sprintf("order-e-%d", i)
			w.mustSidefx("enqueue", "--source", src, "--kind", kind, "--payload", fmt.Sprintf(`{"order": %q, "total": %d}`, src, 100+i))
		}
		hooks = append(hooks, fmt.Sprintf("order-e-%d", i))
	}
	w.startDaemon()
	w.waitTerminal(chargeKind, charges)
	hookRows := w.waitTerminal("webhook.partner", hooks)
	for s, r := range w.waitTerminal("webhook.bearer", hooks) {
		hookRows[s+" bearer"] = r
	}

	// The scan means something only if the secrets went out and came back.
	var sent401, sent200 bool
	var sawUserinfo, sawQuery, sawHeader, sawBearer bool
	for _, r := range rcv.Requests() {
		sent401 = sent401 || r.Status == http.StatusUnauthorized
		sent200 = sent200 || r.Status == http.StatusOK
		u, _ := url.Parse(r.URL)
		if u != nil && u.User != nil {
			p, _ := u.User.Password()
			sawUserinfo = sawUserinfo || p == userinfoPassword
		}
		sawQuery = sawQuery || strings.Contains(r.URL, "token="+queryToken)
		sawHeader = sawHeader || strings.Join(r.Headers["X-Partner-Token"], "") == headerToken
		sawBearer = sawBearer || strings.Join(r.Headers["Authorization"], "") == "Bearer "+bearerToken
	}
	if !sent401 || !sent200 || !sawUserinfo || !sawQuery || !sawHeader || !sawBearer {
		t.Fatalf("the receiver did not get and echo every secret: 401 %t, 200 %t, user information %t, query %t, header %t, bearer %t",
			sent401, sent200, sawUserinfo, sawQuery, sawHeader, sawBearer)
	}
	stored, sample := 0, ""
	for _, s := range sortedKeys(hookRows) {
		if r := hookRows[s]; r.Outcome != "" {
			stored++
			if sample == "" && r.State == "failed" {
				sample = fmt.Sprintf("%s %v outcome %s", s, r, r.Outcome)
			}
		}
	}
	if stored == 0 {
		t.Fatalf("no webhook effect stored an answer: nothing echoed reached the table\n%v", hookRows)
	}

	// The database: every column of every row of every table sidefx has.
	w.scan(t, "the database", w.dumpDatabase(), secrets)

	// What operators print.
	var printed strings.Builder
	ids, err := w.effectIDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		for _, args := range [][]string{{"inspect", strconv.FormatInt(id, 10)}, {"inspect", strconv.FormatInt(id, 10), "--json"}} {
			r := w.mustSidefx(args...)
			printed.WriteString(r.stdout)
		}
	}
	for _, s := range hooks[:2] {
		printed.WriteString(w.mustSidefx("inspect", "--source", s).stdout)
	}
	printed.WriteString(w.mustSidefx("status").stdout)
	printed.WriteString(w.mustSidefx("status", "--json").stdout)
	if !strings.Contains(printed.String(), "webhook.partner") {
		t.Fatalf("sidefx inspect printed no webhook effect:\n%.2000s", printed.String())
	}
	w.scan(t, "sidefx inspect and status output", printed.String(), secrets)
	w.scan(t, "sidefx commands' error output", strings.Join(w.stderrs, "\n"), secrets)

	// The daemon's logs, at debug level.
	for _, d := range w.daemons {
		d.stop()
	}
	logs := w.allLogs()
	if !strings.Contains(logs, `"level":"DEBUG"`) {
		t.Fatalf("the daemon logged nothing at debug level:\n%.2000s", logs)
	}
	w.scan(t, "the daemon's logs", logs, secrets)
	t.Logf("a refused delivery as stored: %.1500s", sample)
	t.Logf("scanned %d effects (%d webhook answers stored), %d bytes printed, %d bytes of logs; the receiver answered %d requests",
		len(ids), stored, printed.Len(), len(logs), len(rcv.Requests()))
}

// scan reports every secret found in text, with what surrounds it.
func (w *world) scan(t *testing.T, where, text string, secrets map[string]string) {
	t.Helper()
	for _, name := range sortedKeys(secrets) {
		s := secrets[name]
		if i := strings.Index(text, s); i >= 0 {
			t.Errorf("%s holds %s (%d times): …%s…", where, name, strings.Count(text, s),
				text[max(0, i-160):min(len(text), i+len(s)+60)])
		}
	}
}

// dumpDatabase returns every row of every table outside the system schemas,
// each as its whole text.
func (w *world) dumpDatabase() string {
	w.t.Helper()
	ctx := context.Background()
	rows, err := w.pool.Query(ctx, `
		SELECT table_schema, table_name FROM information_schema.tables
		 WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema')
		 ORDER BY 1, 2`)
	if err != nil {
		w.t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pgx.Identifier, error) {
		var schema, name string
		err := r.Scan(&schema, &name)
		return pgx.Identifier{schema, name}, err
	})
	if err != nil {
		w.t.Fatal(err)
	}
	var b strings.Builder
	for _, table := range tables {
		rows, err := w.pool.Query(ctx, fmt.Sprintf(`SELECT t::text FROM %s t`, table.Sanitize()))
		if err != nil {
			w.t.Fatalf("read %s: %v", table.Sanitize(), err)
		}
		texts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			w.t.Fatalf("read %s: %v", table.Sanitize(), err)
		}
		fmt.Fprintf(&b, "-- %s (%d rows)\n%s\n", table.Sanitize(), len(texts), strings.Join(texts, "\n"))
	}
	return b.String()
}

// effectIDs returns the ids of every effect.
func (w *world) effectIDs() ([]int64, error) {
	rows, err := w.pool.Query(context.Background(), `SELECT id FROM side_effects ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}
