package repl

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"capnproto.org/go/capnp/v3"
	"github.com/dop251/goja"
	"github.com/itx-dev/itx"
	"github.com/itx-dev/itx/client"
	"github.com/itx-dev/itx/schema"
)

func init() {
	register(&Command{Name: "du", Args: "[prefix]", CLI: true,
		Help: "disk usage: the streams under prefix (default: all), largest first, with the size of their files on disk and their head, and the total",
		Run:  runDu,
		Check: func(args []string) error {
			_, err := parseDu(args)
			return err
		}})
}

func parseDu(args []string) (string, error) {
	switch {
	case len(args) == 0:
		return "", nil
	case len(args) > 1:
		return "", usageError("du", "too many arguments")
	case strings.HasPrefix(args[0], "-"):
		return "", usageError("du", "unknown flag %q", args[0])
	}
	if err := itx.ValidatePathPrefix(args[0]); err != nil {
		return "", usageError("du", "%s", itx.ErrorMessage(err))
	}
	return args[0], nil
}

// duRowJS is one stream as .du prints it.
type duRowJS struct {
	Path       string `json:"path"`
	StreamID   string `json:"streamId"`
	DiskBytes  int64  `json:"diskBytes"`
	Size       string `json:"size"`
	HeadOffset int64  `json:"headOffset"`
}

func runDu(ctx context.Context, s *Session, args []string) error {
	prefix, err := parseDu(args)
	if err != nil {
		return err
	}
	sf, release := s.project.Streams(ctx, nil)
	defer release()
	rows, err := diskUsageRows(ctx, sf.Streams(), prefix)
	if err != nil {
		return err
	}
	var total int64
	for _, r := range rows {
		total += r.DiskBytes
	}
	s.Print(s.toJS(rows))
	if s.cfg.Format != FormatJSON {
		s.note("%s in %s", humanBytes(total), plural(len(rows), "stream"))
	}
	return nil
}

// diskUsageRows is Streams.diskUsage under prefix, largest first.
func diskUsageRows(ctx context.Context, streams schema.Streams, prefix string) ([]duRowJS, error) {
	usage, err := client.DiskUsageIn(ctx, streams, prefix)
	if err != nil {
		return nil, err
	}
	rows := make([]duRowJS, 0, len(usage))
	for _, u := range usage {
		rows = append(rows, duRowJS{Path: u.Path, StreamID: u.StreamID, DiskBytes: u.DiskBytes, Size: humanBytes(u.DiskBytes), HeadOffset: u.HeadOffset})
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].DiskBytes != rows[j].DiskBytes {
			return rows[i].DiskBytes > rows[j].DiskBytes
		}
		return rows[i].Path < rows[j].Path
	})
	return rows, nil
}

func streamsDiskUsage(ctx context.Context, s *Session, c capnp.Client, _ capPath, args []goja.Value) (any, error) {
	o, err := s.params("Streams.diskUsage", args, []string{"prefix"}, "prefix")
	if err != nil {
		return nil, err
	}
	prefix := o.str("prefix")
	if err := o.err(); err != nil {
		return nil, err
	}
	return diskUsageRows(ctx, schema.Streams(c), prefix)
}

// humanBytes writes n in binary units, as du -h does.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
