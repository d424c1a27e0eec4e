// Package builtin lists the provider types sidefx is built with: stripe,
// sendgrid, webhook and http. The daemon gives them to the configuration,
// with those its program adds (daemon.Daemon.ProviderTypes):
//
//	cfg, err := config.Load(path, os.Getenv, builtin.Types()...)
//
// Package config knows no provider type of its own; a program that reads
// the daemon's file passes the types it means to accept.
package builtin

import (
	"github.com/sidefx/sidefx/providers/httpapi"
	"github.com/sidefx/sidefx/providers/ptype"
	"github.com/sidefx/sidefx/providers/sendgrid"
	"github.com/sidefx/sidefx/providers/stripe"
	"github.com/sidefx/sidefx/providers/webhook"
)

// Types returns the built-in provider types, in the order the
// configuration's errors list them: stripe.Type, sendgrid.Type,
// webhook.Type, httpapi.Type. The slice is new on every call.
func Types() []ptype.Type {
	return []ptype.Type{stripe.Type, sendgrid.Type, webhook.Type, httpapi.Type}
}
