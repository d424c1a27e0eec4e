# The README's commands. `make test` is what CI runs (.ci/run).
GO ?= go

.PHONY: release test-release test deps roles-sql vet fmt-check no-binaries cross vet-newest test-newest bench bench-full gobench fuzz soak model failover

## test: install what is missing, then vet and run every test with the race detector
test: deps fmt-check no-binaries vet cross
	$(GO) test -race -count=1 -timeout 30m ./...
# deploy/rulecheck: its own module (Prometheus stays out of go.mod); checks deploy/'s alert rules and dashboard
	cd deploy/rulecheck && $(GO) vet ./... && $(GO) test -count=1 ./...
# internal/lab/drivertest: its own module (lib/pq stays out of go.mod); the outbox's contract over database/sql with lib/pq
	cd internal/lab/drivertest && $(GO) vet ./... && $(GO) test -race -count=1 ./...
# internal/lab/invariant/netfault: its own module (Toxiproxy stays out of go.mod); the network-fault scenarios
	cd internal/lab/invariant/netfault && $(GO) vet ./... && $(GO) test -race -count=1 ./...
# bench: its own module (River stays out of go.mod); vetted here so that a change to sidefx that breaks it shows in CI, run by make bench
	cd bench && $(GO) vet ./... && $(GO) vet -tags benchrev ./... && $(GO) test -count=1 ./...
# examples/nats-consumer: its own module (the NATS server stays out of go.mod; the client is in it for the demo, never in the sidefx binary); a JetStream consumer crashed and killed mid-batch
	cd examples/nats-consumer && $(GO) vet ./... && $(GO) test -race -count=1 ./...
# internal/lab/browsertest: its own module (chromedp stays out of go.mod); the console in a real, headless Chromium (Debian's)
	cd internal/lab/browsertest && $(GO) vet ./... && $(GO) test -count=1 ./...

## vet-newest: build and vet every package and test of every module with the
## newest supported Go release (the go command fetches that toolchain, about
## 76 MB, once). test-newest: also run the tests with it, without -race.
## `make test` runs everything with the Go on PATH, which CI keeps on the
## release line the go.mod's go line names (the oldest supported).
NEWEST_GO ?= go1.27.3
MODULES = . deploy/rulecheck internal/lab/invariant/netfault internal/lab/drivertest examples/nats-consumer internal/lab/browsertest
vet-newest:
	for m in $(MODULES); do (cd $$m && GOTOOLCHAIN=$(NEWEST_GO) $(GO) vet ./...) || exit 1; done

test-newest: deps vet-newest
	GOTOOLCHAIN=$(NEWEST_GO) $(GO) test -short -count=1 ./...
	cd deploy/rulecheck && GOTOOLCHAIN=$(NEWEST_GO) $(GO) test -short -count=1 ./...
	cd internal/lab/invariant/netfault && GOTOOLCHAIN=$(NEWEST_GO) $(GO) test -short -count=1 ./...
	cd internal/lab/drivertest && GOTOOLCHAIN=$(NEWEST_GO) $(GO) test -short -count=1 ./...
	cd examples/nats-consumer && GOTOOLCHAIN=$(NEWEST_GO) $(GO) test -short -count=1 ./...
	cd internal/lab/browsertest && GOTOOLCHAIN=$(NEWEST_GO) $(GO) test -short -count=1 ./...

deps:
	./scripts/install-deps

## roles-sql: rewrite deploy/postgres/bootstrap.sql and the four *-role.sql
## files from internal/roles (what `sidefx roles` grants)
roles-sql:
	$(GO) generate ./internal/roles

## cross: the sidefx binary builds for every platform a release ships, as
## make release builds it (static, -trimpath: the release's builds then come
## from the build cache)
PLATFORMS = linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64
cross:
	for p in $(PLATFORMS); do echo "go build ./cmd/sidefx for $$p"; CGO_ENABLED=0 GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build -trimpath -buildvcs=false -o /dev/null ./cmd/sidefx || exit 1; done

## release: stamped binaries for those platforms, their archives, a .deb and
## an .rpm for linux amd64 and arm64, and SHA256SUMS, in dist/
## (scripts/release; docs/deploy.md). test-release: builds it, then installs
## the .deb on this machine with dpkg (as root), checks it and purges it
## (deploy/release_test.go).
release:
	GO=$(GO) ./scripts/release

test-release: deps release
	SIDEFX_RELEASE_DIST=$(CURDIR)/dist $(GO) test -count=1 -v -run '^TestReleasePackage$$' ./deploy

vet:
	$(GO) vet ./...

## no-binaries: no built executable is tracked (a file git tracks that is
## an ELF, Mach-O or PE binary, or larger than 2 MB)
no-binaries:
	@out=$$(git ls-files -z 2>/dev/null | xargs -0 -r sh -c 'for f; do [ -f "$$f" ] || continue; if [ $$(wc -c < "$$f") -gt 2000000 ] || head -c 4 "$$f" | grep -qaE "^(.ELF|MZ|\xcf\xfa\xed\xfe)"; then echo "$$f"; fi; done' sh); \
	if [ -n "$$out" ]; then echo "built binaries are tracked (add them to .gitignore and git rm --cached them): $$out"; exit 1; fi

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi

## bench: sidefx side by side with River and the SQL floor (bench/, its own
## module; method and latest table in docs/benchmarks.md), every workload at
## sizes that finish in 15–20 minutes on 2 cores. bench-full: the sizes of
## the method (100,000 drained, 30 s latency, 5,000,000 history rows), about
## 40 minutes. gobench: the main module's Go benchmarks.
BENCHFLAGS ?= --runs 3 --drain-n 20000 --latency-rate 1000 --latency-seconds 10 --enqueue-seconds 2 --history 1000000
BENCHFULLFLAGS ?= --runs 3 --drain-n 100000 --latency-rate 1000 --latency-seconds 30 --enqueue-seconds 3 --history 5000000
bench: deps
	cd bench && $(GO) run . --out ../docs/benchmarks-latest.md $(BENCHFLAGS)

bench-full: deps
	cd bench && $(GO) run . --out ../docs/benchmarks-full.md $(BENCHFULLFLAGS)

gobench: deps
	$(GO) test -run '^$$' -bench . -benchmem ./...

## fuzz: each fuzz target for FUZZTIME (default 60s)
FUZZTIME ?= 60s
fuzz:
	$(GO) test ./derive -run '^$$' -fuzz '^FuzzKey$$' -fuzztime $(FUZZTIME)
	$(GO) test ./outbox -run '^$$' -fuzz '^FuzzEncodePayload$$' -fuzztime $(FUZZTIME)
	$(GO) test ./effects -run '^$$' -fuzz '^FuzzValidate$$' -fuzztime $(FUZZTIME)

## soak: 1,000,000 effects through dispatcher processes killed every tenth of the way
SOAK ?= 1000000
soak: deps
	$(GO) test ./dispatcher -run '^TestSoak$$' -soak $(SOAK) -timeout 60m -v

## model: the model checker (dispatcher/model_test.go) for MODEL_BUDGET
## (default 5m): random interleavings of every operation against a real
## PostgreSQL and reference models of the providers, invariants checked
## after every step. make test runs it for 20s.
MODEL_BUDGET ?= 5m
model: deps
	$(GO) test ./dispatcher -run '^TestModel$$' -count=1 -v -timeout 0 -args -model.budget=$(MODEL_BUDGET)

## failover: the failover matrix (internal/lab/failover; docs/reliability.md,
## Failover): a real primary/standby pair, the sidefx daemon draining through
## it, the primary SIGKILLed mid-drain and the standby promoted: an
## asynchronous pair 10 runs x 3 promotions with the daemon alive, 10 with
## the daemon killed and restarted too, and pg_auto_failover (synchronous)
## 5 promotions. The table of figures is logged and written to
## $(FAILOVER_OUT)/_artifacts/*/failover.md. Without -race: the race
## detector slows the producer and the daemon, not the failovers measured.
FAILOVER_OUT ?= /tmp/sidefx-failover
failover: deps
	mkdir -p $(FAILOVER_OUT)
	SIDEFX_FAILOVER=1 $(GO) test -count=1 -v -run '^TestFailover$$' -timeout 40m ./internal/lab/failover -artifacts -outputdir $(FAILOVER_OUT)
