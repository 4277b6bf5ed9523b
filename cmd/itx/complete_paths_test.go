package main

import (
	"encoding/json"
	"testing"

	"github.com/itx-dev/itx"
)

// TestTerminal_TabCompletesStreamPaths: Tab completes a stream's path where one is typed, in
// streams.get("...") and agent("..."), and as the path or prefix of a dot-command, from the
// project's streams; several candidates are listed. It completed only members and commands, so
// every path had to be typed out whole.
func TestTerminal_TabCompletesStreamPaths(t *testing.T) {
	ts := startServer(t)
	for _, p := range []string{"/orders/eu", "/orders/us", "/other"} {
		ts.appendDirect(t, p, itx.EventInput{Type: "e", Payload: json.RawMessage(`{}`)})
	}
	term, _ := bbTerminal(t, ts, 120, 40)

	term.send(`project.streams.get("/orders/e` + "\t")
	term.expect(`get("/orders/eu`)
	term.line(`").describe().path`, `"/orders/eu"`)

	term.send(`agent('/oth` + "\t")
	term.expect(`agent('/other`)
	term.line(`').path`, `"/other"`)

	term.send(".tail /oth\t")
	term.expect(".tail /other")
	term.send(" --from 0\r")
	term.expect("1  ")
	term.send("\x03")
	term.expect("itx> ")

	term.send(".du /orders/\t\t")
	term.expect("/orders/eu")
	term.expect("/orders/us")
	term.send("\x03")
	term.expect("itx> ")

}
