"""Starts a TFF executor service (the wheel's `worker_binary`) on this machine.

    python scripts/start_worker.py --port=8000 [--max_concurrent_computation_calls=-1]

The training program then reaches it with `--workers=HOST:8000,...`. The script replaces
itself with the worker (exec), so the service is this process: stopping it (Ctrl-C,
SIGTERM, a container's stop) stops the worker, and nothing is left behind. It imports
neither TensorFlow nor TFF; the binary is TFF 0.87's own, built without CUDA (CPU only, see
docs/distributed.md, "Accelerators"); a worker built from TFF's source with CUDA takes the same flags.
"""

import argparse
import importlib.util
import os
import sys

_WORKERS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        'tff_algos', 'runtime', 'workers.py')


def _workers_module():
  """tff_algos/runtime/workers.py alone (the package's __init__ would import TensorFlow)."""
  spec = importlib.util.spec_from_file_location('_tff_algos_workers', _WORKERS)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--port', type=int, required=True, help='TCP port to serve on (all interfaces)')
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=-1,
                      help='passed to the worker (-1: no limit)')
  parser.add_argument('--binary', default='', help='a worker_binary of your own (e.g. built with CUDA)')
  args = parser.parse_args(argv)
  if not 0 < args.port < 65536:
    print(f'error: --port must be in 1..65535, got {args.port}', file=sys.stderr)
    return 2
  workers = _workers_module()
  command = workers.worker_command(args.port, args.max_concurrent_computation_calls)
  if args.binary:
    command[0] = args.binary
  if not os.access(command[0], os.X_OK):
    print(f'error: no executable worker binary at {command[0]}; install TFF 0.87 '
          '(bash scripts/setup.sh) or pass --binary', file=sys.stderr)
    return 2
  print(f'TFF executor service on port {args.port}: {" ".join(command)}', flush=True)
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  os.execv(command[0], command)
  return 0  # not reached


if __name__ == '__main__':
  sys.exit(main())
