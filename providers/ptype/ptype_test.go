package ptype_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/providertest"
	"github.com/sidefx/sidefx/providers/ptype"
)

type settings struct {
	TokenEnv string `yaml:"token_env"`
}

func TestProblems_NameTheFieldUnderThePath(t *testing.T) {
	t.Parallel()
	p := ptype.NewProblems(`providers["sms"]`)
	p.Add("token_env", "required")
	p.Add("routes[2].url", "no host")
	p.Add(`["x"]`, "odd")
	p.Add("", "whole: %d", 1)
	want := []ptype.Problem{
		{`providers["sms"].token_env`, "required"},
		{`providers["sms"].routes[2].url`, "no host"},
		{`providers["sms"]["x"]`, "odd"},
		{`providers["sms"]`, "whole: 1"},
	}
	if got := p.List(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("problems %v, want %v", got, want)
	}
}

func TestBuild_Secrets(t *testing.T) {
	t.Parallel()
	dry := ptype.NewBuild(`providers["sms"]`, nil)
	if !dry.DryRun || dry.Secret("token_env", "SMS_TOKEN") != ptype.StandInSecret || dry.Failed() {
		t.Errorf("a dry run reads a stand-in, without a problem: %v", dry.Problems())
	}

	env := map[string]string{"SMS_TOKEN": "Bearer tok-SECRET-0123456789"}
	b := ptype.NewBuild(`providers["sms"]`, func(k string) string { return env[k] })
	if b.DryRun || b.Secret("token_env", "SMS_TOKEN") != env["SMS_TOKEN"] || b.Failed() {
		t.Fatalf("the secret is read: %v", b.Problems())
	}
	if got := b.Redact("refused tok-SECRET-0123456789"); strings.Contains(got, "SECRET") {
		t.Errorf("Redact left the secret: %s", got)
	}
	b.Secret("other_env", "MISSING")
	b.Secret("bad_env", "lower-case")
	b.Unusable("token_env", "SMS_TOKEN", errors.New("the gateway says tok-SECRET-0123456789 is revoked"))
	got := fmt.Sprint(b.Problems())
	for _, want := range []string{
		`providers["sms"].other_env environment variable MISSING is not set or empty`,
		`providers["sms"].bad_env "lower-case" is not an environment variable name`,
		`providers["sms"].token_env the value of SMS_TOKEN is not usable: the gateway says [redacted] is revoked`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("problems %s\nlack %s", got, want)
		}
	}
	if strings.Contains(got, "SECRET") || !b.Failed() {
		t.Errorf("problems hold the secret, or are not failures: %s", got)
	}
}

func TestType_IsItsSpecErased(t *testing.T) {
	t.Parallel()
	if (ptype.Type{Name: "bare"}).Made() {
		t.Errorf("a Type not made by New says it was")
	}
	typ := ptype.New(ptype.Spec[settings]{
		Name: "sms",
		Check: func(s *settings, p *ptype.Problems) {
			if s.TokenEnv == "" {
				p.Add("token_env", "required")
			}
		},
		Build: func(s *settings, b *ptype.Build) (providers.Provider, error) {
			return providertest.New(providertest.Config{Name: b.Name, Idempotent: true}), nil
		},
		DefaultOperation: func(kind string) string { return "send" },
	})
	if !typ.Made() || typ.Settings().Name() != "settings" || typ.DefaultTimeoutOf() != ptype.DefaultTimeout || typ.Keys() != ptype.KeysBySettings {
		t.Errorf("type %v: settings %v, timeout %s, keys %d", typ, typ.Settings(), typ.DefaultTimeoutOf(), typ.Keys())
	}
	s := typ.NewSettings()
	p := ptype.NewProblems(`providers["sms"]`)
	typ.Check(s, p)
	if len(p.List()) != 1 {
		t.Errorf("check: %v", p.List())
	}
	prov, err := typ.Build(s, &ptype.Build{Name: "sms", Timeout: time.Second})
	if err != nil || prov.Name() != "sms" {
		t.Errorf("build: %v, %v", prov, err)
	}
	if !typ.HasOperations() || typ.DefaultOperation("sms.send") != "send" {
		t.Errorf("operations: %t %q", typ.HasOperations(), typ.DefaultOperation("sms.send"))
	}
	if _, _, ok := typ.KeyWindow(s); ok {
		t.Errorf("a type without KeyWindow has one")
	}
	if err := typ.CheckPayload(s, ptype.Kind{Name: "sms.send"}, nil); !errors.Is(err, ptype.ErrNoPayloadCheck) {
		t.Errorf("CheckPayload without one: %v", err)
	}
	if src, err := typ.Events(s, nil, prov); src != nil || err != nil || typ.EventsWithin(s) != 0 {
		t.Errorf("events of a type without them: %v %v", src, err)
	}

	noBuild := ptype.New(ptype.Spec[settings]{Name: "nobuild"})
	if _, err := noBuild.Build(noBuild.NewSettings(), &ptype.Build{}); err == nil || !strings.Contains(err.Error(), "has no build function") {
		t.Errorf("a type without Build: %v", err)
	}
}
