package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

func TestTracing_OffByDefaultValidatedAndSecret(t *testing.T) {
	cfg := mustParse(t, minimal, nil)
	rt, err := config.Build(cfg, getenv(secretEnv()), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Tracing.OTLPEndpoint != "" || rt.Tracing.SampleRatio != 1 || rt.Tracing.ServiceName != "sidefx" {
		t.Errorf("default tracing %+v, want off, ratio 1, service sidefx", rt.Tracing)
	}

	for doc, want := range map[string]string{
		"tracing: {otlp_endpoint: 'collector:4318'}":                                  `tracing.otlp_endpoint: scheme "collector" is not http or https`,
		"tracing: {otlp_endpoint: 'http://u:p@collector:4318'}":                       `tracing.otlp_endpoint: holds user information`,
		"tracing: {otlp_endpoint: 'http://collector:4318', sample_ratio: 1.5}":        `tracing.sample_ratio: 1.5: want a share above 0 and at most 1`,
		"tracing: {otlp_endpoint: 'http://collector:4318', sample_ratio: -0.1}":       `tracing.sample_ratio: -0.1`,
		"tracing: {headers_env: {X-Api-Key: OTLP_KEY}}":                               `tracing.headers_env: set without tracing.otlp_endpoint`,
		"tracing: {otlp_endpoint: 'http://c:4318', headers_env: {'X Key': OTLP_KEY}}": `tracing.headers_env["X Key"]: not a valid header name`,
		"tracing: {otlp_endpoint: 'http://c:4318', sampel_ratio: 0.5}":                `tracing.sampel_ratio: unknown field`,
	} {
		_, err := config.Parse([]byte(minimal+doc+"\n"), getenv(nil), builtin.Types()...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %s", doc, err, want)
		}
	}

	cfg = mustParse(t, minimal+"tracing: {otlp_endpoint: 'https://collector.example:4318', sample_ratio: 0.25, headers_env: {X-Api-Key: OTLP_KEY}}\n", nil)
	if _, err := config.Build(cfg, getenv(secretEnv()), nil); err == nil || !strings.Contains(err.Error(), `tracing.headers_env["X-Api-Key"]: environment variable OTLP_KEY is not set or empty`) {
		t.Errorf("Build without the header's variable: %v", err)
	}
	env := secretEnv()
	env["OTLP_KEY"] = "SECRETotlpKEY"
	rt, err = config.Build(cfg, getenv(env), nil)
	if err != nil {
		t.Fatal(err)
	}
	if rt.Tracing.Headers["X-Api-Key"] != "SECRETotlpKEY" || rt.Tracing.SampleRatio != 0.25 {
		t.Errorf("tracing %v", rt.Tracing.SampleRatio)
	}
	for _, s := range []string{rt.String(), fmt.Sprintf("%+v", rt), fmt.Sprint(cfg)} {
		if strings.Contains(s, "SECRETotlpKEY") {
			t.Errorf("printed the header's value: %s", s)
		}
		if !strings.Contains(s, "collector.example") {
			t.Errorf("the endpoint is not printed: %s", s)
		}
	}
}
