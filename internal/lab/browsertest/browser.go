// Package browsertest drives a real browser, the system's Chromium
// (Debian's chromium package, which make deps installs; browser downloads
// by test tools do not work everywhere), with chromedp, for the tests of
// sidefx's web console. It is a module of its own, so that chromedp never
// enters the main go.mod.
package browsertest

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Chromium returns the path of the browser: $SIDEFX_CHROMIUM, else
// chromium or chromium-browser on PATH. Without one the test is skipped,
// saying how to install it, unless CI=true, where it fails.
func Chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SIDEFX_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no Chromium: apt-get install chromium (make deps does), or set SIDEFX_CHROMIUM"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// Browser starts a headless Chromium of its own for the test, at width x
// height, and returns a context for chromedp actions in one tab; it is
// closed in t.Cleanup.
func Browser(t testing.TB, width, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Chromium(t)),
		chromedp.Flag("headless", "new"),
		chromedp.NoSandbox, // tests may run as root, where the sandbox refuses to start
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(width, height),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first action starts the browser, which lives as long as ctx: no
	// timeout on it. Each test bounds its own steps (Within).
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	// The window cannot be narrower than Chromium's minimum; the viewport
	// can, as a phone's.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(int64(width), int64(height))); err != nil {
		t.Fatalf("setting the viewport to %dx%d: %v", width, height, err)
	}
	return ctx
}

// Within returns ctx bounded by d, for a test's steps in the browser.
func Within(t testing.TB, ctx context.Context, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, d)
	t.Cleanup(cancel)
	return ctx
}
