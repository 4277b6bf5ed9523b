package repl

import (
	"context"
	"fmt"
	"strings"

	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
)

func init() {
	register(&Command{Name: "rm", Args: "<path> [--force] [--recursive]", CLI: true,
		Help: "delete a stream for good (its events, subscriptions, readers and scheduled appends; the admin right); refused while it has subscriptions, registered readers or open connections unless --force, as is a stream whose database is lost or damaged (--force deletes it unread); --recursive also deletes every stream below the path (/path/...)",
		Run:  runRm,
		Check: func(args []string) error {
			_, err := parseRm(args)
			return err
		}})
}

type rmArgs struct {
	path             string
	force, recursive bool
}

func parseRm(args []string) (rmArgs, error) {
	var a rmArgs
	for _, arg := range args {
		switch {
		case arg == "--force":
			a.force = true
		case arg == "--recursive" || arg == "-r":
			a.recursive = true
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
	if a.recursive && a.path == "/" {
		return a, usageError("rm", "--recursive on / would delete every stream of the project: name a narrower path")
	}
	return a, nil
}

// rmRowJS is one stream rm deleted.
type rmRowJS struct {
	Path       string `json:"path"`
	StreamID   string `json:"streamId"`
	HeadOffset int64  `json:"headOffset"`
	// Unread: its database could not be read (lost or damaged); --force deleted it unread.
	Unread bool `json:"unread,omitempty"`
}

// runRm deletes one stream (with --recursive, every stream at or below the path, deepest
// first) and prints what was deleted. A stream refused stops nothing else: the error names each.
func runRm(ctx context.Context, s *Session, args []string) error {
	a, err := parseRm(args)
	if err != nil {
		return err
	}
	if !a.recursive {
		gone, err := client.DeleteStream(ctx, s.project, a.path, a.force)
		if err != nil {
			return ForceHint(err, "--force")
		}
		s.Print(s.toJS(rmRowJS{a.path, gone.StreamID, gone.HeadOffset, gone.Unread}))
		return nil
	}
	list, err := client.ListStreams(ctx, s.project, a.path)
	if err != nil {
		return err
	}
	var paths []string
	for i := len(list) - 1; i >= 0; i-- { // children before their parent
		if itx.PathUnder(list[i].Path, a.path) {
			paths = append(paths, list[i].Path)
		}
	}
	if len(paths) == 0 {
		return itx.Errorf(itx.ENotFound, "no stream at or below %s", a.path)
	}
	rows := []rmRowJS{}
	var failed []string
	var code itx.Code
	for _, p := range paths {
		gone, err := client.DeleteStream(ctx, s.project, p, a.force)
		switch {
		case itx.ErrorCode(err) == itx.ENotFound: // deleted meanwhile
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s: %s", p, itx.ErrorMessage(err)))
			if code == "" {
				code = itx.ErrorCode(err)
			}
		default:
			rows = append(rows, rmRowJS{p, gone.StreamID, gone.HeadOffset, gone.Unread})
		}
		if ctx.Err() != nil {
			break
		}
	}
	s.Print(s.toJS(rows))
	if len(failed) > 0 {
		return ForceHint(itx.Errorf(code, "%s not deleted: %s", plural(len(failed), "stream"), strings.Join(failed, "; ")), "--force")
	}
	return nil
}

// ForceHint names the flag that forces a deletion itxd refused "unless forced" (a stream with
// consumers, a project with streams): its message says "by forcing", which from a shell does
// not say how.
func ForceHint(err error, flag string) error {
	if itx.ErrorCode(err) != itx.EFailedPrecondition || !strings.HasSuffix(itx.ErrorMessage(err), "by forcing") {
		return err
	}
	return itx.Errorf(itx.EFailedPrecondition, "%s (%s)", itx.ErrorMessage(err), flag)
}
