module github.com/itx-dev/itx

go 1.26.8

require (
	capnproto.org/go/capnp/v3 v3.1.0-alpha.2
	github.com/anishathalye/porcupine v1.3.1
	github.com/blues/jsonata-go v1.5.4
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/chzyer/readline v1.5.1
	github.com/creack/pty v1.1.24
	github.com/dop251/goja v0.0.0-20260917113740-793a2a65c13b
	github.com/evanphx/json-patch/v5 v5.9.11
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/prometheus/client_golang v1.25.0
	github.com/prometheus/client_model v0.6.3
	github.com/psanford/sqlite3vfs v0.0.0-20260519004904-f9180fa2acc9
	github.com/rs/zerolog v1.35.1
	github.com/stretchr/testify v1.12.1
	github.com/wI2L/jsondiff v0.7.1
	go.uber.org/goleak v1.3.0
	golang.org/x/net v0.62.0
	golang.org/x/term v0.47.0
)

require (
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/colega/zeropool v0.0.0-20230505084239-6fb4a4f75381 // indirect
	github.com/dlclark/regexp2/v2 v2.5.2 // indirect
	github.com/go-sourcemap/sourcemap v2.1.3+incompatible // indirect
	github.com/google/pprof v0.0.0-20230207041349-798e818bf904 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/mattn/go-colorable v0.1.14 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/tidwall/gjson v1.18.0 // indirect
	github.com/tidwall/match v1.1.1 // indirect
	github.com/tidwall/pretty v1.2.1 // indirect
	github.com/tidwall/sjson v1.2.5 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.49.0
	golang.org/x/text v0.43.0
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/blues/jsonata-go => ./third_party/jsonata-go

replace capnproto.org/go/capnp/v3 => ./third_party/go-capnp
