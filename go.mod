module github.com/porthole-dev/porthole

go 1.26.8

require (
	github.com/opencontainers/runtime-spec v1.3.0
	go.uber.org/zap v1.28.0
)

require go.uber.org/multierr v1.10.0 // indirect
