package config

import (
	"encoding/json"
	"fmt"

	"github.com/sidefx/sidefx/payloadcheck"
	"github.com/sidefx/sidefx/providers"
)

// CheckPayload checks payload for kind as the kind's provider would before
// sending it (Stripe's parameters, decoded strictly; SendGrid's mail-send
// body), without a secret or a request: payloadcheck's check, which a
// producer can link without the providers; a provider of a registered type
// is built with stand-in secrets and asked. A kind the configuration lacks is an error; a provider
// that cannot check payloads (webhook) accepts any JSON object.
func (c *Config) CheckPayload(kind string, payload json.RawMessage) error {
	k, ok := c.Kinds[kind]
	if !ok {
		return fmt.Errorf("kind %q is not configured", kind)
	}
	pc := c.Providers[k.Provider]
	if pc.ptype == nil {
		// A built-in type: the providers' own checks, without the providers.
		check, err := payloadcheck.New(map[string]payloadcheck.Kind{kind: {Provider: k.Provider, Type: pc.Type, Operation: k.Operation}}, nil)
		if err != nil {
			return err
		}
		return check(kind, payload)
	}
	p, err := pc.dryRun(k.Provider)
	if err != nil {
		return fmt.Errorf("provider %s: %w", k.Provider, err)
	}
	defer closeProvider(p)
	if pch, ok := p.(providers.PayloadChecker); ok {
		return pch.CheckPayload(kind, payload)
	}
	return nil
}

// standInSecrets are well-formed secrets for the provider pc describes, to
// build it without the real ones: building opens no connection.
func standInSecrets(pc ProviderConfig) secrets {
	s := secrets{apiKey: standIn[pc.Type], signing: []string{standIn[TypeWebhook]}}
	for h := range pc.HeadersEnv {
		if s.headers == nil {
			s.headers = map[string]string{}
		}
		s.headers[h] = "stand-in"
	}
	return s
}
