package browsertest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sidefx/sidefx/internal/lab/browsertest"
)

// The browser starts, loads a page and reads it back: the harness works
// before the console's tests rely on it.
func TestBrowser_LoadsAPage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `<!doctype html><title>sidefx</title><p id="p">hello</p><script>document.getElementById("p").textContent += ", " + window.innerWidth</script>`)
	}))
	defer srv.Close()
	ctx := browsertest.Within(t, browsertest.Browser(t, 390, 844), time.Minute)
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL)); err != nil {
		t.Fatal(err)
	}
	title, err := chromedp.Run(ctx, chromedp.Title())
	if err != nil {
		t.Fatal(err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text("#p"))
	if err != nil {
		t.Fatal(err)
	}
	if title != "sidefx" || text != "hello, 390" {
		t.Fatalf("title %q, text %q", title, text)
	}
}
