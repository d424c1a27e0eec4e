// Command custom-provider is the sidefx daemon with one provider type more:
// "ledger", a team's own bookkeeping service. It runs everything sidefx
// runs — the YAML configuration, the dispatcher, drift, metrics and the
// operators' commands — and a provider of type ledger is configured like
// the built-in ones:
//
//	providers:
//	  books:
//	    type: ledger                       # registered below
//	    timeout: 5s                        # the fields every provider has
//	    url: http://ledger.internal:8080   # ledger's own fields (Settings)
//	    token_env: LEDGER_TOKEN
//	kinds:
//	  ledger.entry: {provider: books}
//
// Build and run it as you would sidefx:
//
//	go build -o sidefx-ledger ./examples/custom-provider
//	LEDGER_TOKEN=… ./sidefx-ledger run --config sidefx.yaml
package main

import (
	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/daemon"
)

func main() {
	d := &daemon.Daemon{ProviderTypes: []config.ProviderType{LedgerType}}
	d.Main()
}
