package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/internal/console"
	"github.com/sidefx/sidefx/internal/engine"
	"github.com/sidefx/sidefx/internal/httpbound"
	"github.com/sidefx/sidefx/providers"
)

// consoleHandler builds the web console the configuration describes (nil
// when console.listen is unset): its tokens read from console.tokens_file
// and console.tokens_env, the operations with the configuration's key
// windows and payload checks. An error names the field, never a line of
// the tokens.
func consoleHandler(cfg *config.Config, built map[string]providers.Provider, getenv func(string) string, db engine.DB, store *engine.Store, log *slog.Logger) (*console.Handler, int, error) {
	cc := cfg.Console
	if cc.Listen == "" {
		return nil, 0, nil
	}
	var tokens []console.Token
	if cc.TokensFile != "" {
		b, err := os.ReadFile(cc.TokensFile)
		if err != nil {
			return nil, 0, fmt.Errorf("console.tokens_file: %w", err)
		}
		ts, err := console.ParseTokens(string(b))
		if err != nil {
			return nil, 0, fmt.Errorf("console.tokens_file %s: %w", cc.TokensFile, err)
		}
		tokens = append(tokens, ts...)
	}
	if cc.TokensEnv != "" {
		v := getenv(cc.TokensEnv)
		if strings.TrimSpace(v) == "" {
			return nil, 0, fmt.Errorf("console.tokens_env: environment variable %s is not set or empty", cc.TokensEnv)
		}
		ts, err := console.ParseTokens(v)
		if err != nil {
			return nil, 0, fmt.Errorf("console.tokens_env (%s): %w", cc.TokensEnv, err)
		}
		tokens = append(tokens, ts...)
	}
	if len(tokens) == 0 && cc.IdentityHeader == "" {
		return nil, 0, errors.New("console: no token in console.tokens_file or console.tokens_env, and no trusted proxy: nobody could sign in")
	}
	var proxies []netip.Prefix
	for _, p := range cc.TrustedProxies {
		prefix, err := netip.ParsePrefix(strings.TrimSpace(p))
		if err != nil {
			return nil, 0, fmt.Errorf("console.trusted_proxies: %w", err) // validated by Load already
		}
		proxies = append(proxies, prefix)
	}
	byKind := map[string]console.Provider{}
	for kind, k := range cfg.Kinds {
		p := console.Provider{Name: k.Provider}
		if dl, ok := built[k.Provider].(providers.DashboardLinker); ok {
			p.Link = dl.DashboardLink
		}
		byKind[kind] = p
	}
	warning := plainExposure(cc.Listen, len(proxies) > 0, cc.SecureCookie)
	h, err := console.New(console.Config{
		Store: store, Ops: opsFor(cfg, store), DB: db, Schema: store.Schema(),
		Providers: byKind, HiddenFields: cc.HiddenFields,
		Auth:    console.Auth{Tokens: tokens, TrustedProxies: proxies, IdentityHeader: cc.IdentityHeader, RoleHeader: cc.RoleHeader, SecureCookie: cc.SecureCookie},
		Log:     log.With("component", "console"),
		Warning: warning,
	})
	if warning != "" && err == nil {
		log.Warn("console: " + warning)
	}
	return h, len(tokens), err
}

// plainExposure says what is wrong with a console that listens beyond
// loopback over plain HTTP with nothing in front said to terminate TLS (no
// trusted proxy, no secure_cookie): its tokens and session cookies cross
// the network in clear. "" when it listens on loopback only, or a proxy
// is configured.
func plainExposure(listen string, proxies, secureCookie bool) string {
	if proxies || secureCookie {
		return ""
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	if host == "localhost" {
		return ""
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return ""
	}
	return fmt.Sprintf("this console listens on %s over plain HTTP, beyond loopback, with no proxy in front: its sign-in tokens and session cookies cross the network in clear. "+
		"Listen on 127.0.0.1 and put a TLS proxy in front (console.trusted_proxies, console.secure_cookie)", listen)
}

// serveConsole starts the console's server on listen; the returned
// function shuts it down.
func serveConsole(h http.Handler, listen string, tokens int, proxies bool, log *slog.Logger) (func(), error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("console listen %s: %w", listen, err)
	}
	// A form is read within 30 s; an answer (a bulk action's included)
	// written within 2 minutes. The console bounds its bodies itself
	// (console.MaxBody, console.BodyBudget).
	srv := httpbound.Server(h, 30*time.Second, 2*time.Minute)
	srv.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("console server stopped", "err", err)
		}
	}()
	log.Info("console listening", "console", ln.Addr().String(), "tokens", tokens, "trusted_proxies", proxies)
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
