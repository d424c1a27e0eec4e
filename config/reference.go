package config

// Reference is a complete configuration file, every field commented with
// its default. It is valid as it stands once the environment variables it
// names are set; the README includes it.
const Reference = `# sidefx daemon configuration (YAML). Every field is optional unless it says
# "required"; a value shown is the default unless it says "example".
# Durations are written as Go writes them: 500ms, 60s, 5m, 720h. A bare
# number is refused: it has no unit. Unknown fields are errors.
#
# Secrets are never written here: a provider names the environment variables
# that hold its secrets (api_key_env, secret_env, secrets_env, headers_env),
# and sidefx reads them at start-up. sidefx never prints a secret, the
# database password, a header value or a webhook URL's query, and redacts
# each from whatever a provider echoes back before it is stored or logged.

# PostgreSQL connection string, as a URL or key=value pairs (pgx syntax).
# Required, here or in SIDEFX_DATABASE_URL, which wins. A password may also
# come from PGPASSWORD or ~/.pgpass. (Example.)
database_url: postgres://sidefx@localhost:5432/app

# Schema that holds side_effects and the other sidefx tables; the
# migrations create it.
schema: public

# Key namespace, mixed into every derived idempotency key so that two
# deployments sharing one provider account (staging and production, say)
# never send the same key: up to 64 of A-Z a-z 0-9 . _ : -. "" leaves the
# namespace stored in the database as it is (none, at first). It can change
# only while side_effects is empty.
namespace: ""

http:
  # host:port of the metrics and health endpoint (/metrics, /healthz,
  # /readyz). Loopback only by default; ":9464" listens on every interface.
  # SIDEFX_HTTP_LISTEN wins.
  listen: 127.0.0.1:9464

log:
  # Lowest level logged: debug, info, warn or error. SIDEFX_LOG_LEVEL wins.
  level: info
  # text or json. SIDEFX_LOG_FORMAT wins.
  format: text

dispatcher:
  # Provider calls in flight at most, over all providers.
  workers: 200
  # Effects claimed by one statement at most.
  batch_size: 200
  # Claims running at once at most: the first whenever effects may be
  # due, the others only while claims come back full (a backlog).
  claim_loops: 1
  # How long a claimed effect stays fired before it is rescued as its
  # worker's death. At least 1s, and above every kind's timeout (its own,
  # else its provider's): the default timeouts are 30s at most.
  lease: 60s
  # How often an idle dispatcher looks for due effects (a cheap index
  # probe; it claims only when one is due). It bounds how long a new
  # effect waits for an idle dispatcher.
  poll_interval: 10ms
  # How long confirmed, failed and cancelled effects are kept whole before
  # they are compacted into tombstones (payload and answer dropped; key,
  # payload hash, state, reference and history kept, and with them the
  # (source_id, kind) guard: a replay is still a duplicate). Negative keeps
  # them whole forever.
  retention: 720h
  # Delete tombstones this old. 0 keeps them forever. Deleting one frees its
  # (source_id, kind): a replay of its source afterwards is enqueued again,
  # under a key the provider may have forgotten, and may be performed twice.
  tombstone_retention: 0s
  # How often expired leases are rescued. Default lease/4, at least 1s.
  rescue_interval: 15s
  # How often effects past their retention are compacted.
  reap_interval: 1h
  # At shutdown, how long calls in flight may finish before they are
  # cancelled and recorded as unknown.
  shutdown_timeout: 30s

# The provider instances kinds name, by name (lowercase: a letter, then
# letters, digits, _ - .). The name shows in logs and metrics. Which fields
# apply depends on the type; setting one that does not is an error.
# Limits, for every type: concurrency bounds the calls in flight (0: the
# provider's share of dispatcher.workers), rate_per_second the calls started per second (0:
# unlimited), burst the calls that may start at once under the rate (0:
# max(1, rate_per_second); only with a rate).
providers:
  stripe:                            # (example)
    type: stripe                     # stripe, sendgrid or webhook; required
    api_key_env: STRIPE_API_KEY      # required: variable holding sk_… or rk_…
    base_url: https://api.stripe.com # a stripe-mock, say, for tests
    timeout: 30s                     # per request; its kinds' default
    concurrency: 0
    rate_per_second: 0
    burst: 0
  mail:                              # (example)
    type: sendgrid
    api_key_env: SENDGRID_API_KEY    # required
    base_url: https://api.sendgrid.com # https://api.eu.sendgrid.com for EU subusers
    timeout: 30s
  partner:                           # (example)
    type: webhook                    # Standard Webhooks, signed
    # Required; http or https. Its user information and query values are
    # secrets: never printed, redacted from whatever the receiver echoes.
    url: https://partner.example/hooks
    secret_env: PARTNER_WEBHOOK_SECRET # required (or secrets_env): whsec_…
    # More signing secrets, for rotation: each delivery is signed with
    # every one, and a receiver that knows any one verifies it. Add the
    # new secret here, give it to the receiver, then drop the old one.
    secrets_env: []                  # e.g. [PARTNER_WEBHOOK_SECRET_NEW]
    timeout: 10s
    # How long the receiver keeps the webhook-ids it has processed: sidefx
    # never sends a possibly-delivered effect again after it. Positive.
    key_window: 24h
    headers:                         # static headers, default none; values
      X-Tenant: t1                   # never printed (example)
    headers_env: {}                  # header → variable holding its value,
                                     # e.g. {Authorization: PARTNER_TOKEN}

# The effect kinds served, by kind (lowercase dotted words; at least one).
kinds:
  charge.create:                     # (example)
    provider: stripe                 # required: a name under providers
    # Stripe providers only: the operation, one of payment_intents.create,
    # payment_intents.capture, payment_intents.cancel, charges.create,
    # refunds.create, customers.create, transfers.create. Default the
    # kind's last two words ("stripe.refunds.create" → refunds.create).
    operation: charges.create
    # Attempts per effect at most (an effect's own max_attempts wins).
    # Default 25. The attempts, timeouts and backoffs of a kind whose
    # provider forgets keys (Stripe after 24h, a webhook after key_window)
    # must end within that window, or the policy is refused.
    max_attempts: 20
    # One provider call at most; below dispatcher.lease. Default the
    # provider's timeout.
    timeout: 30s
    backoff_base: 1s                 # wait before attempt 2, doubled after,
    backoff_max: 1h                  # up to this (jittered)
    # Accept a policy that can outlast the key window: attempts that would
    # end past it are not made, and the effect is left uncertain.
    outlast_key_window: false
  email.receipt:                     # (example)
    provider: mail
    # sendgrid providers only, which take no idempotency key: retry an
    # unknown outcome (the mail may arrive twice) instead of marking the
    # effect uncertain for an operator.
    at_least_once: false
  webhook.order_paid:                # (example)
    provider: partner

drift:
  # When the rules run: 5 cron fields ("*/5 * * * *") or a descriptor
  # ("@hourly", "@every 5m").
  schedule: "@every 5m"
  # A pending effect older than this counts as stuck.
  pending_after: 1h
  # How long stored drift runs are kept.
  retention: 720h
  # An Alertmanager /api/v2/alerts endpoint for firing and resolved alerts.
  # Default none.
  alert_url: ""
  # How long each statement of a rule may run (rules run read-only); the
  # database cancels it past this and the rule's run fails.
  statement_timeout: 30s
  # Checks that what should have an effect has exactly one. Default none.
  # Each rule (example, disabled):
  #   - name: paid_orders_charged      # required, unique, lowercase
  #     kind: charge.create            # required: a kind above
  #     sql: |                         # required: the source ids that must
  #       SELECT id::text FROM orders WHERE status = 'paid'
  #     grace: 10m                     # how long a fresh source may wait
  #     window: 24h                    # how far back to look; above grace
  #     sample: 0                      # example ids per finding; 0: default
  #     check_at_most: 0               # check a random sample; 0: everything
  #     statement_timeout: 0s          # 0: drift.statement_timeout
  rules: []
`
