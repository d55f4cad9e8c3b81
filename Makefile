# make quick: the fast loop (go test -short: one transport, no process-spawning tests).
# make check: go vet and every Go test once (no -race, fuzzing or real-torch interop).
# make test: the full suite, scripts/test.sh.
.PHONY: quick check test build

quick:
	go test -short -count=1 -parallel 8 ./...

check:
	go vet ./...
	go test -count=1 ./...

test:
	scripts/test.sh

build:
	go build -o bin/storeguard ./cmd/storeguard
