#!/bin/bash
# The peak memory of TFF's worker over a whole command (e.g. a training run):
#   bash benchmarks/worker_peak.sh LOG -- COMMAND...
# runs COMMAND with its output in LOG, polls the largest VmHWM of its worker_binary
# children every 0.5 s while it runs, and appends "rc=<exit code> worker_peak_kB=<peak>".
set -u
log=$1; shift; [ "${1:-}" = "--" ] && shift
"$@" > "$log" 2>&1 &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
  for w in $(pgrep -P "$pid" -f worker_binary); do
    h=$(awk '/VmHWM/{print $2}' "/proc/$w/status" 2>/dev/null)
    if [ -n "$h" ] && [ "$h" -gt "$peak" ]; then peak=$h; fi
  done
  sleep 0.5
done
wait "$pid"; rc=$?
echo "rc=$rc worker_peak_kB=$peak" >> "$log"
exit "$rc"
