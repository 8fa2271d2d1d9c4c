#!/usr/bin/env bash
# One installer for README and CI: creates .venv/ at the repository root (reused when complete),
# installs the pinned environment and TensorFlow Federated 0.87.0, and the Debian Fashion-MNIST
# data when missing. Safe to run repeatedly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
STAMP="$VENV/.tff_algos_complete"
REQ_HASH="$(cat "$ROOT/requirements.txt" "$ROOT/scripts/setup.sh" | sha256sum | cut -d' ' -f1)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$REQ_HASH" ]]; then
  echo "setup: reusing complete environment $VENV"
else
  echo "setup: creating $VENV (about 2 minutes)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade "setuptools>=68" wheel
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
  # TFF's own jaxlib pin cannot be satisfied: install it alone, its requirements came above.
  # google-vizier (TFF's tuning integration) pins attrs==23.1.0 and wants grpcio-tools; TFF imports
  # it, and its runtime needs only what is above.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps tensorflow-federated==0.87.0 google-vizier==0.1.11
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
  "$VENV/bin/python" - <<'PY'
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow_federated as tff
import tff_algos  # noqa: F401  (also stops TFF's worker cleanly at exit)
print("setup: tensorflow_federated", tff.__version__, "and tff_algos import")
PY
  echo "$REQ_HASH" > "$STAMP"
fi

FMNIST=/usr/share/datasets/fashion-mnist
if [[ ! -d "$FMNIST" ]]; then
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing Debian package dataset-fashion-mnist"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
      || echo "setup: could not install dataset-fashion-mnist; --dataset=digits still works offline"
  else
    echo "setup: Fashion-MNIST missing; run: sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist"
    echo "setup: continuing; --dataset=digits works without it"
  fi
fi
echo "setup: done. Activate with: source $VENV/bin/activate"
