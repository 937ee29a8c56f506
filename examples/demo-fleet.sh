#!/usr/bin/env bash
# A fleet on one machine: three dblockrun daemons share one PostgreSQL database
# and a job that is due every second; each second exactly one of them runs it.
#
#   examples/demo-fleet.sh [SECONDS]          # default: 10
#
# Environment:
#   DBLOCKRUN_DB            database URL (default postgresql://postgres@127.0.0.1:5432/test)
#   DBLOCKRUN_TABLE_PREFIX  table prefix (default dblockrun_demo_, apart from a real fleet's)
#   DBLOCKRUN               the dblockrun command (default: .venv/bin/dblockrun of this
#                           checkout, else dblockrun on PATH, else python3 -m dblockrun)
#
# No docker-compose needed: the daemons are local processes, stopped (and
# their temporary folder removed) when the script ends, even on Ctrl-C.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_TO_RUN=${1:-10}
DAEMONS=3
export DBLOCKRUN_DB=${DBLOCKRUN_DB:-postgresql://postgres@127.0.0.1:5432/test}
export DBLOCKRUN_TABLE_PREFIX=${DBLOCKRUN_TABLE_PREFIX:-dblockrun_demo_}

if [[ -n ${DBLOCKRUN:-} ]]; then
    read -r -a dblockrun <<<"$DBLOCKRUN"
elif [[ -x $ROOT/.venv/bin/dblockrun ]]; then
    dblockrun=("$ROOT/.venv/bin/dblockrun")
elif command -v dblockrun >/dev/null; then
    dblockrun=(dblockrun)
else
    dblockrun=(python3 -m dblockrun)
fi

step() { printf '\n==> %s\n' "$*"; }

workdir=$(mktemp -d "${TMPDIR:-/tmp}/dblockrun-demo.XXXXXX")
pids=()
sleeper=

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    [[ -z $sleeper ]] || kill "$sleeper" 2>/dev/null || true
    if ((${#pids[@]})); then
        kill -TERM "${pids[@]}" 2>/dev/null || true
        wait "${pids[@]}" 2>/dev/null || true
    fi
    rm -rf "$workdir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cat >"$workdir/jobs.yaml" <<'EOF'
# The same file on every "host".
jobs:
  tick:
    cron: "* * * * * *"          # every second (6 fields: seconds first)
    command: echo "tick $DBLOCKRUN_SLOT token $DBLOCKRUN_FENCING_TOKEN"
    lock-at-most: 30s
  sync-region:
    cron: "*/5 * * * * *"        # every 5 seconds, fanned out over the daemons
    items: [eu-west, eu-north, us-east, us-west, ap-south, ap-east]
    command: echo "syncing $DBLOCKRUN_ITEM"; sleep 1
EOF

step "database: $("${dblockrun[@]}" init-db)"

step "starting $DAEMONS daemons on $workdir/jobs.yaml"
for i in $(seq 1 "$DAEMONS"); do
    # Short heartbeat and lease: a killed daemon's job moves on within 3 s.
    "${dblockrun[@]}" daemon --heartbeat 1s --lease 3s --grace 5s "$workdir/jobs.yaml" \
        >"$workdir/daemon-$i.log" 2>&1 &
    pids+=($!)
    printf '    daemon %d: pid %d, log %s\n' "$i" "$!" "$workdir/daemon-$i.log"
done

step "waiting ${SECONDS_TO_RUN}s"
sleep "$SECONDS_TO_RUN" &
sleeper=$!
wait "$sleeper"  # not a foreground sleep: Ctrl-C and SIGTERM reach the traps at once
for i in "${!pids[@]}"; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
        printf 'daemon %d exited early:\n' "$((i + 1))" >&2
        cat "$workdir/daemon-$((i + 1)).log" >&2
        exit 1
    fi
done

step "dblockrun status"
"${dblockrun[@]}" status

step "dblockrun history tick -n 8"
"${dblockrun[@]}" history tick -n 8

step "stopping the daemons (SIGTERM)"
kill -TERM "${pids[@]}"
wait "${pids[@]}" || true
pids=()

step "who ran each tick: one daemon per second, never two"
for i in $(seq 1 "$DAEMONS"); do
    sed -n "s/^\([^ ]*\) INFO \[tick\] \(.*\)/\1 daemon $i: \2/p" "$workdir/daemon-$i.log"
done | sort | tail -n 12

step "runs per daemon"
for i in $(seq 1 "$DAEMONS"); do
    ticks=$(grep -c 'INFO \[tick\]' "$workdir/daemon-$i.log" || true)
    items=$(grep -c 'INFO \[sync-region:' "$workdir/daemon-$i.log" || true)
    printf '    daemon %d: %s ticks, %s sync-region items\n' "$i" "$ticks" "$items"
done
printf '\nTables %s* stay in the database for another look:\n' "$DBLOCKRUN_TABLE_PREFIX"
printf '    DBLOCKRUN_DB=%q DBLOCKRUN_TABLE_PREFIX=%q dblockrun history\n' \
    "$DBLOCKRUN_DB" "$DBLOCKRUN_TABLE_PREFIX"
