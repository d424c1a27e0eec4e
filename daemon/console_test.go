package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/internal/lab/pgtest"
)

// sidefx run serves the console on console.listen, with the tokens of
// console.tokens_env, and nothing when it is unset; the token is never
// logged.
func TestDaemon_ServesTheConsoleOnItsOwnAddress(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	url := pgtest.URL(t)
	const token = "sfxc_daemon-test-token-0123456789"
	sum := sha256.Sum256([]byte(token))
	dir := t.TempDir()
	write := func(name, extra string) string {
		path := filepath.Join(dir, name)
		cfg := fmt.Sprintf(`database_url: %q
log: {level: info, format: json}
providers:
  partner: {type: webhook, url: "http://127.0.0.1:1/hooks", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
%s`, url, extra)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	env := append(os.Environ(), "PARTNER_WEBHOOK_SECRET=whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw==",
		"SIDEFX_CONSOLE_TOKENS="+hex.EncodeToString(sum[:])+" operator ops on call")

	// Off by default.
	d := startDaemon(t, bin, env, "run", "--config", write("off.yaml", ""))
	d.waitFor("/readyz", http.StatusOK, "ready")
	d.stop()
	if strings.Contains(d.logs(), "console") {
		t.Errorf("a daemon without console.listen speaks of a console:\n%s", d.logs())
	}

	addr := freeAddr(t)
	d = startDaemon(t, bin, env, "run", "--config", write("on.yaml", fmt.Sprintf("console: {listen: %q, tokens_env: SIDEFX_CONSOLE_TOKENS}\n", addr)))
	d.waitFor("/readyz", http.StatusOK, "ready")
	d.waitAt(addr, "/login", http.StatusOK, `name="token"`)
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "ops on call") || !strings.Contains(string(body), "webhook.order_paid") {
		t.Errorf("the console's overview: %d\n%s", resp.StatusCode, body)
	}
	// The main endpoint does not serve the console.
	d.waitFor("/effects", http.StatusNotFound, "")
	d.stop()
	logs := d.logs()
	if !strings.Contains(logs, `"msg":"console listening"`) || !strings.Contains(logs, addr) {
		t.Errorf("the log does not say where the console listens:\n%s", logs)
	}
	if strings.Contains(logs, token) || strings.Contains(logs, hex.EncodeToString(sum[:])) {
		t.Errorf("the log holds the token or its hash:\n%s", logs)
	}
}

// A console whose tokens cannot be read stops the start, naming the
// field, not the file's lines.
func TestRun_ConsoleTokensThatCannotBeRead(t *testing.T) {
	t.Parallel()
	c, _, _ := newCLI(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "tokens")
	if err := os.WriteFile(bad, []byte("secret-looking-line operator x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for tokensFile, want := range map[string]string{
		filepath.Join(dir, "missing"): "console.tokens_file: open",
		bad:                           "tokens line 1: the first field is not a SHA-256",
	} {
		path := filepath.Join(dir, "sidefx.yaml")
		cfg := fmt.Sprintf(`database_url: %q
providers:
  partner: {type: webhook, url: "http://127.0.0.1:1/hooks", secret_env: PARTNER_WEBHOOK_SECRET}
kinds:
  webhook.order_paid: {provider: partner}
console: {listen: "127.0.0.1:0", tokens_file: %q}
`, c.url, tokensFile)
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		c.env = map[string]string{"PARTNER_WEBHOOK_SECRET": "whsec_ZGFlbW9uLXRlc3Qtc2lnbmluZy1rZXktMzJieXRlcw=="}
		err := c.refuse("run", "--config", path, "--listen", "127.0.0.1:0")
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "secret-looking-line") {
			t.Errorf("tokens file %s: %v, want %q", tokensFile, err, want)
		}
	}
}

// A console beyond loopback over plain HTTP, with nothing in front, is
// warned of: a line in the log at start and a banner on every page.
func TestConsole_WarnsWhenExposedOverPlainHTTP(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		listen        string
		proxies, cook bool
		warn          bool
	}{
		{"127.0.0.1:8080", false, false, false},
		{"[::1]:8080", false, false, false},
		{"localhost:8080", false, false, false},
		{"0.0.0.0:8080", false, false, true},
		{":8080", false, false, true},
		{"10.0.0.5:8080", false, false, true},
		{"0.0.0.0:8080", true, false, false},
		{"0.0.0.0:8080", false, true, false},
	} {
		if got := plainExposure(c.listen, c.proxies, c.cook); (got != "") != c.warn {
			t.Errorf("plainExposure(%q, proxies %v, secure cookie %v) = %q", c.listen, c.proxies, c.cook, got)
		}
	}
}
