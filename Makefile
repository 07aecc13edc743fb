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

bench: deps build
	$(GO) run ./cmd/porthole-bench

fmt:
	gofmt -w $$(git ls-files '*.go')
