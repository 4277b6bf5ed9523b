package testnetwork

//go:generate capnp compile -I ../../../std -ogo testnetwork.capnp
