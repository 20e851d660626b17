#!/usr/bin/env bash
# Stop the daemons slurm/up.sh started (listed in $PRX_SLURM_STATE/started), newest first.
# Daemons it did not start are left running.
set -euo pipefail
STATE=${PRX_SLURM_STATE:-/run/prx-slurm}
[ -f "$STATE/started" ] || { echo "slurm/down.sh: nothing started by slurm/up.sh" >&2; exit 0; }
tac "$STATE/started" | while read -r name pid; do
  if kill -0 "$pid" 2>/dev/null && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ]; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    echo "slurm/down.sh: stopped $name (pid $pid)" >&2
  fi
done
rm -f "$STATE/started"
