# itx: durable event streams as Cap'n Proto capabilities.
GO       ?= go
DATA     ?= .itx-data
ADDR     ?= 127.0.0.1:7878
METRICS  ?= 127.0.0.1:7879
CAPNP_GO := capnproto.org/go/capnp/v3

.PHONY: build run test race bench compare soak fuzz sim generate vet fmt clean

build:
	$(GO) build -o bin/itxd ./cmd/itxd
	$(GO) build -o bin/itx ./cmd/itx

## run: start itxd on the embedded default data directory (./.itx-data) and print how to connect
run: build
	./bin/itxd --listen $(ADDR) --data $(DATA) --metrics $(METRICS)

## test: vet and run every test (unit, end-to-end over TCP, crash recovery); vet the nested bench
## module too, so a change to the packages it uses cannot leave make compare broken
test:
	$(GO) vet ./...
	$(GO) -C bench vet ./...
	$(GO) test -count=1 -timeout 12m ./...

## race: every test under the race detector, the end-to-end ones too: their in-process servers
## with -race, and the itxd and remotehost processes they start built with -race (ITXD_RACE=1),
## each process's log checked for the detector's reports. Several times slower than make test
race:
	ITXD_RACE=1 $(GO) test -race -count=1 -timeout 90m ./...

## bench: the benchmarks recorded in docs/benchmarks.md (a separate itxd process, durable)
bench:
	$(GO) test -run '^$$' -bench . -benchtime 5s -timeout 60m ./test/

## compare: itxd beside NATS JetStream (sync_always, and default for reference), raw fdatasync and
## raw SQLite on the same disk, interleaved rounds, one table of medians and ratios
## (a nested module, bench/, keeps NATS out of the main module)
compare:
	cd bench && $(GO) run ./compare -rounds 3

## soak: a mixed load (appenders, webhook, copy, forwarder, followers, churning sessions,
## connections, live views, readers; the reference processors in a remotehost program of their
## own, the agent's vendor failing and hanging now and then) against itxd for 10 minutes, killing
## itxd with SIGKILL every minute and the remotehost about every 25 s, with a scheduled backup
## every minute; checks every acknowledged event reached every consumer, every prompt settled
## once and no request reached the vendor twice, the newest backup against the live streams, and
## prints itxd's footprint
soak:
	$(GO) build -o bin/itxd ./cmd/itxd
	$(GO) build -o bin/remotehost ./processors/examples/remotehost
	cd bench && $(GO) run ./soak -itxd ../bin/itxd -duration 10m -crash-every 1m -backup-every 1m -remotehost ../bin/remotehost -host-crash-every 25s

## fuzz: look for JSONata inputs that hang or exhaust the server (see third_party/jsonata-go/PATCHES.md)
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzJSONata -fuzztime 5m ./server/

## sim: a long run of the stream core's deterministic simulation (make test runs 12 seeds x 250 steps)
sim:
	$(GO) test -count=1 -run TestSimulation -timeout 60m ./server/ -sim.seeds 500 -sim.steps 2000

## generate: remake schema/itx.capnp.go (needs Debian's capnproto package). schema/include holds
## the go.capnp annotations, copied from the go-capnp module, so other languages compile the schema
## without Go: capnp compile -I schema/include -oc++:out --src-prefix=schema schema/itx.capnp
generate:
	$(GO) install $(CAPNP_GO)/capnpc-go@$$($(GO) list -m -f '{{.Version}}' $(CAPNP_GO))
	cmp schema/include/go.capnp "$$($(GO) list -m -f '{{.Dir}}' $(CAPNP_GO))/std/go.capnp"
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" capnp compile -I schema/include \
		-ogo:schema --src-prefix=schema schema/itx.capnp

vet:
	$(GO) vet ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin
