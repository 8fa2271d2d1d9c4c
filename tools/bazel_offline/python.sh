#!/bin/sh
# The interpreter of `bazel test`: the project's virtual environment (.venv at the repository
# root), started by its own path so that its site-packages apply. Bazel runs this file through
# a runfiles symlink, hence readlink.
exec "$(dirname "$(readlink -f "$0")")/../../.venv/bin/python" "$@"
