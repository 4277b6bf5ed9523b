#!/bin/sh
# gen.sh COMMIT NAME [STOP]: builds itxd at COMMIT in a temporary worktree, starts it on a fresh
# data directory, fills it with populate/main.go (built against that commit's client, with the
# sections that commit lacks cut: CUT="MOUNT SCHED ADMIN" names them, and SED, a sed script, for
# the client's older names), stops it (STOP: term, the
# default, or kill9) and packs the data directory as NAME.tar.gz here.
set -eu
commit=$1 name=$2 stop=${3:-term}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
tmp=$(mktemp -d)
wt=$tmp/old
git -C "$repo" worktree add --detach "$wt" "$commit" >/dev/null
pid=
trap '{ [ -z "$pid" ] || kill -9 $pid 2>/dev/null || true; }; git -C "$repo" worktree remove --force "$wt"; rm -rf "$tmp"' EXIT
mkdir -p "$wt/cmd/populate"
src=$here/populate/main.go
for tag in ${CUT:-}; do
	awk -v t="$tag" '$0 ~ "//"t"\\{" {skip=1; next} $0 ~ "//}"t {skip=0; next} !skip' "$src" >"$tmp/p.go"
	src=$tmp/p.go
	cp "$src" "$tmp/p2.go"; src=$tmp/p2.go
done
sed -e "${SED:-}" "$src" >"$wt/cmd/populate/main.go"
(cd "$wt" && go build -o "$tmp/itxd" ./cmd/itxd && go build -o "$tmp/populate" ./cmd/populate)
data=$tmp/data
mkdir -p "$data"
"$tmp/itxd" --listen 127.0.0.1:0 --data "$data" --addr-file "$tmp/addr" --log-level warn 2>"$tmp/itxd.log" &
pid=$!
while [ ! -s "$tmp/addr" ]; do kill -0 $pid; sleep 0.05; done
short=$(git -C "$repo" rev-parse --short "$commit")
if [ "$stop" = kill9 ]; then
	# kill -9 mid-traffic: populate keeps appending until itxd dies
	"$tmp/populate" -addr "$(cat "$tmp/addr")" -data "$data" -commit "$short" -traffic >/dev/null &
	ppid=$!
	while [ "$(cat "$data/acked.jsonl" 2>/dev/null | wc -l)" -lt 25 ]; do kill -0 $ppid; sleep 0.01; done
	kill -9 $pid
	wait $ppid || true
else
	"$tmp/populate" -addr "$(cat "$tmp/addr")" -data "$data" -commit "$short" >/dev/null
	kill -TERM $pid
fi
wait $pid || true
cat "$tmp/itxd.log" >&2
rm -f "$data/expected.json.tmp"
tar -C "$data" -czf "$here/$name.tar.gz" .
ls -l "$here/$name.tar.gz"
