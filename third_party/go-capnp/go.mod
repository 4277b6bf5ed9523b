module capnproto.org/go/capnp/v3

go 1.19

require (
	github.com/colega/zeropool v0.0.0-20230505084239-6fb4a4f75381
	github.com/kylelemons/godebug v1.1.0
	github.com/stretchr/testify v1.9.0
	github.com/tinylib/msgp v1.1.9
	github.com/tj/assert v0.0.3
	golang.org/x/exp v0.0.0-20240604190554-fc45aab8b7f8
	golang.org/x/sync v0.7.0
)

require (
	github.com/davecgh/go-spew v1.1.1 // indirect
	github.com/philhofer/fwd v1.1.2 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
