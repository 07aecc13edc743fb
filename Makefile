# Porthole. `make run` brings up the local stack; `make test` runs every test.
GO ?= go
BIN := bin

.PHONY: build run test deps bench vet fmt

build:
	$(GO) build -o $(BIN)/sandboxd ./cmd/sandboxd
	$(GO) build -o $(BIN)/caddy ./cmd/caddy

# Installs what sandboxes and tests need (runc, Node.js, Python) when it is missing. Idempotent.
deps:
	@./scripts/deps.sh

run: deps build
	@./scripts/run-local.sh

test: deps build
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 20m ./...

# The edge rows use wrk when it is installed (a lighter load generator than Go's TLS client).
bench: deps build
	@command -v wrk >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq wrk >/dev/null; } || true
	$(GO) run ./cmd/porthole-bench
	$(GO) run ./cmd/porthole-bench -sessions 500 -pool-size 0
	$(GO) run ./cmd/porthole-bench -edge -pool-size 0

fmt:
	gofmt -w $$(git ls-files '*.go')
