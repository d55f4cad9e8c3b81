# make check: the everyday loop (go vet and every Go test once; no -race, fuzzing or
# real-torch interop). make test: the full suite, scripts/test.sh.
.PHONY: check test build

check:
	go vet ./...
	go test -count=1 ./...

test:
	scripts/test.sh

build:
	go build -o bin/storeguard ./cmd/storeguard
