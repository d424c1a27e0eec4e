package config_test

import (
	"fmt"

	"github.com/sidefx/sidefx/config"
	"github.com/sidefx/sidefx/providers/builtin"
)

// Every problem is reported at once, each with its line and field path.
func ExampleParse() {
	doc := `database_url: postgres://localhost/app
dispatcher: {lease: 60}
providers:
  stripe: {type: stripe, api_key_env: STRIPE_API_KEY}
kinds:
  charge.create: {provider: strpe, operation: charges.create}
  refund.create: {provider: stripe, operation: refunds.create, at_least_once: true}
`
	_, err := config.Parse([]byte(doc), func(string) string { return "" }, builtin.Types()...)
	fmt.Println(err)
	// Output:
	// line 2: dispatcher.lease: 60 is not a duration: a bare number has no unit (want e.g. 60s)
	// line 6: kinds["charge.create"].provider: no provider named "strpe" (providers: stripe)
	// line 7: kinds["refund.create"].at_least_once: provider "stripe" (stripe) is idempotent: an unknown outcome is retried with the same key anyway; at_least_once is only for sendgrid providers
}

// Secrets are named, not written: Build reads them from the environment.
func ExampleBuild() {
	doc := `database_url: postgres://sidefx:hunter2@localhost/app
providers:
  mail: {type: sendgrid, api_key_env: SENDGRID_API_KEY}
kinds:
  email.receipt: {provider: mail, at_least_once: true}
`
	env := map[string]string{"SENDGRID_API_KEY": "SG.example"}
	cfg, err := config.Parse([]byte(doc), func(name string) string { return env[name] }, builtin.Types()...)
	if err != nil {
		fmt.Println(err)
		return
	}
	rt, err := config.Build(cfg, func(name string) string { return env[name] }, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rt.Close()
	fmt.Println(rt.Providers["mail"].Name(), rt.Dispatcher.Kinds["email.receipt"].AtLeastOnce)
	fmt.Println(config.RedactDatabaseURL(rt.DatabaseURL))

	_, err = config.Build(cfg, func(string) string { return "" }, nil)
	fmt.Println(err)
	// Output:
	// mail true
	// postgres://sidefx:xxxxx@localhost/app
	// providers["mail"].api_key_env: environment variable SENDGRID_API_KEY is not set or empty
}
