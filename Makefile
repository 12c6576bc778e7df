# couchjobs. `make run` starts the sample node on the embedded store;
# `make test` runs every fast test. See README.md.

GO      ?= go
BIN     := bin
PKGS    := ./...
# Packages with code under the fdb build tag, type-checked without libfdb_c.
FDBPKGS := ./runtime/kv/fdbkv ./runtime/tuple ./host
BENCHTIME ?= 2s

# The protobuf generators, pinned; protoc itself is Debian's protobuf-compiler.
PROTOC_GEN_GO      := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1

.PHONY: all build build-fdb plugins run test test-race test-slow test-fdb check-fdb bench bench-thesis bench-fairness bench-replication bench-indexing fuzz lint proto clean

all: lint test

build:
	$(GO) build -o $(BIN)/couchjobs ./host/cmd/couchjobs

# The plugins, where runtime.toml's plugin_dir points.
plugins:
	$(GO) build -o $(BIN)/plugins/couchjobs-shell ./plugins/shell/cmd/couchjobs-shell
	$(GO) build -o $(BIN)/plugins/couchjobs-peruser ./plugins/peruser/cmd/couchjobs-peruser
	$(GO) build -o $(BIN)/plugins/couchjobs-replication ./plugins/replication/cmd/couchjobs-replication
	$(GO) build -o $(BIN)/plugins/couchjobs-indexing ./plugins/indexing/cmd/couchjobs-indexing
	$(GO) build -o $(BIN)/plugins/couchjobs-wordcount ./examples/wordcount

# The FoundationDB backend needs cgo and libfdb_c (docs/FOUNDATIONDB.md).
build-fdb:
	$(GO) build -tags fdb -o $(BIN)/couchjobs ./host/cmd/couchjobs

# Runs the sample node (runtime.toml) on the embedded store until Ctrl-C.
run: build plugins
	mkdir -p var
	$(BIN)/couchjobs run -config runtime.toml

test:
	$(GO) test -count=1 -short $(PKGS)

test-race:
	$(GO) test -count=1 -short -race $(PKGS)

# Slow suites: the race detector over everything, a short fuzzing pass over
# every decoder, the conformance suite on the second SQLite driver, the
# full 10,000-job, three-process test of the job layer, and host processes
# killed with SIGKILL (the shell plugin's on_lost policies among them,
# replications resuming from their checkpoints, and index builds from
# view_seq).
test-slow: test-race fuzz
	$(GO) test -count=1 -run 'Modernc|ManyProcesses|KilledHost|KilledNode' ./runtime/kv/sqlitekv ./runtime/jobs ./host/cmd/couchjobs ./plugins/shell ./plugins/peruser ./plugins/replication ./plugins/indexing

# The conformance suite and tuple compatibility against a real cluster.
test-fdb:
	@test -n "$$FDB_CLUSTER_FILE" || { echo "set FDB_CLUSTER_FILE to a cluster file (docs/FOUNDATIONDB.md)"; exit 1; }
	$(GO) test -count=1 -tags fdb ./runtime/...

# Type-checks the fdb-tagged code with cgo faked, on machines without libfdb_c.
check-fdb:
	$(GO) run ./.ci/fdbcheck $(FDBPKGS)

bench:
	$(GO) test -count=1 -run '^$$' -bench . -benchtime $(BENCHTIME) ./runtime/...
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 20000x ./host

# The thesis's evaluation on 1 to 3 host processes (docs/BENCHMARKS.md):
# about 10 minutes with the thesis's 5 s steps; THESIS_SLEEP=0.5 for a
# quick run.
THESIS_SLEEP ?= 5
bench-thesis:
	$(GO) run ./plugins/shell/thesis -sleep $(THESIS_SLEEP)

# The fair-share scheduler across two host processes (docs/BENCHMARKS.md):
# shares under saturation, and a noisy neighbour; about 3 minutes.
bench-fairness:
	$(GO) run ./plugins/internal/benchfair

# The replicator against PouchDB's and the _bulk_docs ceiling on a local
# pouchdb-server (docs/BENCHMARKS.md); about 15 minutes, most of it
# PouchDB's. BENCH_REPLICATION_FLAGS="-rounds 1 -only '10,000 small docs'"
# for a quick look.
BENCH_REPLICATION_FLAGS ?=
bench-replication:
	$(GO) run ./plugins/replication/internal/benchrep $(BENCH_REPLICATION_FLAGS)

# Builds a 100,000-document view in real host and plugin processes beside
# pouchdb-server's own build of it, then compares query latencies.
bench-indexing:
	$(GO) run ./plugins/indexing/internal/benchidx $(BENCH_INDEXING_FLAGS)

# An execution count, not a duration: with a duration, Go 1.26's fuzzing
# coordinator can fail a target with "context deadline exceeded" at the
# deadline on a loaded machine, with no failing input (golang/go#75804,
# fixed in Go 1.27). FUZZTIME=30s still works for a longer local run.
FUZZTIME ?= 100000x
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzUnpack -fuzztime $(FUZZTIME) ./runtime/tuple
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./host/config
	$(GO) test -run '^$$' -fuzz FuzzDecodeRecord -fuzztime $(FUZZTIME) ./runtime/jobs
	$(GO) test -run '^$$' -fuzz FuzzParseDoc -fuzztime $(FUZZTIME) ./plugins/shell
	$(GO) test -run '^$$' -fuzz FuzzSecurity -fuzztime $(FUZZTIME) ./plugins/peruser
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) ./plugins/replication
	$(GO) test -run '^$$' -fuzz FuzzFeeds -fuzztime $(FUZZTIME) ./plugins/internal/couch
	$(GO) test -run '^$$' -fuzz FuzzOpenRevsMultipart -fuzztime $(FUZZTIME) ./plugins/internal/couch
	$(GO) test -run '^$$' -fuzz FuzzKey -fuzztime $(FUZZTIME) ./plugins/indexing/collate
	$(GO) test -run '^$$' -fuzz FuzzQuery -fuzztime $(FUZZTIME) ./plugins/indexing
	$(GO) test -run '^$$' -fuzz FuzzDesign -fuzztime $(FUZZTIME) ./plugins/indexing
	$(GO) test -run '^$$' -fuzz FuzzEntries -fuzztime $(FUZZTIME) ./plugins/indexing

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(MAKE) --no-print-directory check-fdb

# Regenerates the plugin protocol's Go code (committed) from sdk/proto.
proto:
	@command -v protoc >/dev/null || { echo "protoc is missing: apt-get install protobuf-compiler"; exit 1; }
	GOBIN=$(CURDIR)/$(BIN) $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/$(BIN) $(GO) install $(PROTOC_GEN_GO_GRPC)
	PATH=$(CURDIR)/$(BIN):$$PATH protoc -I sdk/proto \
		--go_out=sdk/proto --go_opt=paths=source_relative \
		--go-grpc_out=sdk/proto --go-grpc_opt=paths=source_relative \
		sdk/proto/couchjobs/plugin/v1/plugin.proto

clean:
	rm -rf $(BIN) var
