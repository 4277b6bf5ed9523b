package capnp

//go:generate go run internal/gen/gen.go
