package providers_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                              0,
		"7":                             7 * time.Second,
		" 3 ":                           3 * time.Second,
		"1.5":                           1500 * time.Millisecond,
		"0":                             0,
		"-4":                            0,
		"soon":                          0,
		"Sat, 21 Nov 2026 12:00:30 GMT": 30 * time.Second,
		"Sat, 21 Nov 2026 11:59:00 GMT": 0, // in the past
		"99999999999":                   0, // absurd
	}
	for v, want := range cases {
		h := http.Header{}
		if v != "" {
			h.Set("Retry-After", v)
		}
		if got := providers.RetryAfter(h, now); got != want {
			t.Errorf("Retry-After %q = %s, want %s", v, got, want)
		}
	}
}

func TestClassifyStatus(t *testing.T) {
	t.Parallel()
	cases := map[int]providers.Class{
		200: providers.Confirmed, 201: providers.Confirmed, 202: providers.Confirmed, 204: providers.Confirmed,
		400: providers.Rejected, 401: providers.Rejected, 402: providers.Rejected, 404: providers.Rejected, 410: providers.Rejected, 422: providers.Rejected,
		408: providers.Retryable, 425: providers.Retryable, 429: providers.Retryable,
		// The peer may have acted: another attempt under the key in
		// flight, or a failure after the work began.
		409: providers.Unknown, 500: providers.Unknown, 502: providers.Unknown, 503: providers.Unknown, 504: providers.Unknown,
		100: providers.Unknown, 301: providers.Unknown, 302: providers.Unknown, 303: providers.Unknown, 600: providers.Unknown,
	}
	for code, want := range cases {
		if got := providers.ClassifyStatus(code); got != want {
			t.Errorf("status %d = %s, want %s", code, got, want)
		}
	}
}

func TestTransportResult(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	cases := []struct {
		name string
		err  error
		want providers.Class
	}{
		{"refused", fmt.Errorf("post: %w", refused), providers.Retryable},
		{"dns", &net.DNSError{Err: "no such host", Name: "nowhere.invalid"}, providers.Retryable},
		{"idle closed", errors.New("http: server closed idle connection"), providers.Retryable},
		{"reset after send", reset, providers.Unknown},
		{"eof", fmt.Errorf("post: %w", errors.New("EOF")), providers.Unknown},
		{"deadline", fmt.Errorf("post: %w", context.DeadlineExceeded), providers.Unknown},
		{"cancelled", context.Canceled, providers.Unknown},
	}
	for _, c := range cases {
		r := providers.TransportResult("test call", c.err)
		if r.Class != c.want || r.Err == nil || !errors.Is(r.Err, c.err) {
			t.Errorf("%s: %s (%v), want %s wrapping the cause", c.name, r.Class, r.Err, c.want)
		}
	}
	// A real refused connection, end to end.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = http.Post("http://"+addr, "application/json", nil)
	if err == nil {
		t.Fatal("a post to a closed port succeeded")
	}
	if r := providers.TransportResult("post", err); !r.IsRetryable() {
		t.Fatalf("real refused connection: %s (%v)", r.Class, r.Err)
	}
}

func TestResultConstructorsAndPredicates(t *testing.T) {
	t.Parallel()
	cases := []struct {
		r    providers.Result
		want providers.Class
	}{
		{providers.Confirm("pi_1", true, nil), providers.Confirmed},
		{providers.Reject(nil, nil), providers.Rejected},
		{providers.Retry(nil, time.Second), providers.Retryable},
		{providers.Unsure(nil), providers.Unknown},
	}
	for _, c := range cases {
		preds := []bool{c.r.IsConfirmed(), c.r.IsRejected(), c.r.IsRetryable(), c.r.IsUnknown()}
		for i, p := range preds {
			if p != (providers.Class(i+1) == c.want) {
				t.Errorf("%s: predicate %d = %v", c.want, i, p)
			}
		}
		if !c.r.Valid() || c.r.Class.String() != map[providers.Class]string{1: "confirmed", 2: "rejected", 3: "retryable", 4: "unknown"}[c.want] {
			t.Errorf("%s: Valid %v String %s", c.want, c.r.Valid(), c.r.Class)
		}
		if c.want != providers.Confirmed && c.r.Err == nil {
			t.Errorf("%s with a nil error has no error", c.want)
		}
	}
	if (providers.Result{}).Valid() {
		t.Error("the zero Result is valid")
	}
}
