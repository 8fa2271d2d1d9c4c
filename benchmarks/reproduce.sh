#!/usr/bin/env bash
# Runs, or continues, the whole reproduction (benchmarks/REPRODUCTION.md), suite after suite:
# each suite's learning-rate grid first (when it has one), then every run over seeds 0, 1, 2,
# then its probes (runs at changed settings that test a diagnosis, when it has some).
# A finished run is skipped and a stopped one resumes exactly, so after a kill or at a new
# session the same command continues:
#   nohup bash benchmarks/reproduce.sh > reproduce.log 2>&1 &
# About 10 hours on 2 idle cores. Pages are rewritten after every suite; commit them with
# the run directories (benchmarks/<suite>/runs, tuning, probes, tuned.json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
for suite in ${SUITES:-fedcda fedcross cadis fedlex}; do
  if "$PY" -c "import sys; from benchmarks import suites; sys.exit(0 if suites.SUITES['$suite'].grid else 1)"; then
    "$PY" -m benchmarks.compare --suite="$suite" --tune
  fi
  "$PY" -m benchmarks.compare --suite="$suite"
  if "$PY" -c "import sys; from benchmarks import suites; sys.exit(0 if suites.SUITES['$suite'].probes else 1)"; then
    "$PY" -m benchmarks.compare --suite="$suite" --probes
  fi
  if [ "$suite" = cadis ]; then   # CADIS's weights, clusters and KD term, from its runs
    "$PY" -m benchmarks.cadis_diagnosis
  fi
done
