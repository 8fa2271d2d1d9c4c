#!/usr/bin/env bash
# Runs, or continues, the whole reproduction (benchmarks/results/REPRODUCTION.md), suite after suite:
# each suite's learning-rate grid first (when it has one), then every run over seeds 0, 1, 2,
# then its probes (runs at changed settings that test a diagnosis, when it has some).
# A finished run is skipped and a stopped one resumes exactly, so after a kill or at a new
# session the same command continues:
#   nohup bash benchmarks/reproduce.sh > reproduce.log 2>&1 &
# SUITES="cadis fedlex" limits it to those suites. JOBS=2 runs two `compare` commands side by
# side at each step: they share the step's runs (a run one of them holds, the other skips and
# waits for at the end), which puts to work the time a single run leaves the cores idle
# while its Python side prepares, evaluates and checkpoints a round.
# Tens of hours on 2 cores at the suites' present lengths (`python -m benchmarks.compare
# --suite=S --plan` sizes each step from the suite's recorded rounds). Pages are rewritten after every suite; commit them with
# the run directories (benchmarks/<suite>/runs, tuning, probes, tuned.json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python

compare() {   # JOBS copies of `python -m benchmarks.compare "$@"`; fails if any fails
  local pids=() pid status=0
  for _ in $(seq "${JOBS:-1}"); do
    "$PY" -m benchmarks.compare "$@" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done   # every copy ends first
  return "$status"
}

has() {   # has SUITE grid|probes: the suite declares a tuning grid / probes
  "$PY" -c "import sys; from benchmarks import suites; sys.exit(0 if suites.SUITES['$1'].$2 else 1)"
}

for suite in ${SUITES:-fedcda fedcross cadis fedlex}; do
  if has "$suite" grid; then
    compare --suite="$suite" --tune
  fi
  compare --suite="$suite"
  if has "$suite" probes; then
    compare --suite="$suite" --probes
  fi
  if [ -f "benchmarks/${suite}_diagnosis.py" ]; then   # what its runs measured, on its own page
    "$PY" -m "benchmarks.${suite}_diagnosis"
  fi
done
# FedProx against FedAvg one round at a time, at the settings of the runs above (~10 min)
"$PY" -m benchmarks.fedprox_pull
