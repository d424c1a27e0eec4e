package config

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sidefx/sidefx/providers"
	"github.com/sidefx/sidefx/providers/ptype"
)

// CheckPayload checks payload for kind as the kind's provider would before
// sending it, without a secret or a request: its type's payload check
// (Stripe's parameters, decoded strictly; SendGrid's mail-send body), the
// same as payloadcheck's, which a producer can link without the providers;
// for a type without one, a provider built with stand-in secrets is asked,
// if it checks payloads (providers.PayloadChecker). A kind the
// configuration lacks is an error; a provider that cannot check payloads
// (webhook) accepts any JSON object.
func (c *Config) CheckPayload(kind string, payload json.RawMessage) error {
	k, ok := c.Kinds[kind]
	if !ok {
		return fmt.Errorf("kind %q is not configured", kind)
	}
	pc := c.Providers[k.Provider]
	t := c.types().lookup(pc.Type)
	if t == nil || !pc.fits(t) {
		return fmt.Errorf("provider %s: %q is not a provider type the configuration knows", k.Provider, pc.Type)
	}
	if err := t.CheckPayload(pc.Settings, c.kindUse(kind, k), payload); !errors.Is(err, ptype.ErrNoPayloadCheck) {
		return err
	}
	p, problems, err := pc.dryRun(k.Provider, t, c.operations(k.Provider))
	switch {
	case err != nil:
		return fmt.Errorf("provider %s: %w", k.Provider, err)
	case len(problems) > 0:
		return fmt.Errorf("provider %s: %s: %s", k.Provider, problems[0].Path, problems[0].Message)
	}
	defer closeProvider(p)
	if pch, ok := p.(providers.PayloadChecker); ok {
		return pch.CheckPayload(kind, payload)
	}
	return nil
}

// types returns the provider types the configuration knows, by name.
func (c *Config) types() *registry {
	if c.reg != nil {
		return c.reg
	}
	r, _ := newRegistry(c.ProviderTypes) // Load and Build report the error
	return r
}
