package repl

import (
	"context"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
)

func init() {
	register(&Command{Name: "rm", Args: "<path> [--force]", CLI: true,
		Help: "delete a stream for good (its events, subscriptions, readers and scheduled appends; the admin right); refused while it has subscriptions, registered readers or open connections unless --force",
		Run:  runRm,
		Check: func(args []string) error {
			_, err := parseRm(args)
			return err
		}})
}

type rmArgs struct {
	path  string
	force bool
}

func parseRm(args []string) (rmArgs, error) {
	var a rmArgs
	for _, arg := range args {
		switch {
		case arg == "--force":
			a.force = true
		case strings.HasPrefix(arg, "-"):
			return a, usageError("rm", "unknown flag %q", arg)
		case a.path != "":
			return a, usageError("rm", "too many arguments")
		default:
			if err := itx.ValidatePath(arg); err != nil {
				return a, usageError("rm", "%s", itx.ErrorMessage(err))
			}
			a.path = arg
		}
	}
	if a.path == "" {
		return a, usageError("rm", "")
	}
	return a, nil
}

// runRm deletes one stream and prints what was deleted.
func runRm(ctx context.Context, s *Session, args []string) error {
	a, err := parseRm(args)
	if err != nil {
		return err
	}
	gone, err := client.DeleteStream(ctx, s.project, a.path, a.force)
	if err != nil {
		return err
	}
	s.Print(s.toJS(struct {
		Path       string `json:"path"`
		StreamID   string `json:"streamId"`
		HeadOffset int64  `json:"headOffset"`
	}{a.path, gone.StreamID, gone.HeadOffset}))
	return nil
}
