"""Starts a TFF executor service (the wheel's `worker_binary`) on this machine.

    python scripts/start_worker.py --port=8000 [--bind=127.0.0.1]
        [--max_concurrent_computation_calls=-1]
    python scripts/start_worker.py --bind=unix:/run/user/1000/tff/worker.sock

The training program then reaches it with `--workers=HOST:8000,...` or `--workers=unix:PATH`.
The worker runs any TensorFlow computation it is handed, unauthenticated, so it listens only
where `--bind` says: loopback by default (reach it from another machine through an SSH
tunnel, docs/distributed.md), or a Unix socket (only users allowed into its directory reach
it). The binary itself can only listen on every interface: it runs in a network namespace of
its own, relayed to that address (tff_algos/runtime/isolation.py). `--bind=0.0.0.0` runs it as
TFF does, reachable by anyone who can reach the port.

The service is this process: stopping it (Ctrl-C, SIGTERM, a container's stop) stops the
worker, and nothing is left behind. It imports neither TensorFlow nor TFF; the binary is TFF
0.87's own, built without CUDA (CPU only, see docs/distributed.md, "Accelerators"); a worker
built from TFF's source with CUDA takes the same flags.
"""

import argparse
import importlib.util
import os
import sys

_ISOLATION = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          'tff_algos', 'runtime', 'isolation.py')
_EVERY_INTERFACE = ('0.0.0.0', '::', '*')


def _isolation_module():
  """tff_algos/runtime/isolation.py alone (the package's __init__ would import TensorFlow)."""
  spec = importlib.util.spec_from_file_location('_tff_algos_isolation', _ISOLATION)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--port', type=int, default=0,
                      help='TCP port to serve on (with --bind=HOST)')
  parser.add_argument('--bind', default='127.0.0.1',
                      help='where to listen: an IP address of this machine (127.0.0.1: this '
                      'machine only), unix:PATH (a Unix socket), or 0.0.0.0 (every interface: '
                      'anyone who reaches the port can run code as this user)')
  parser.add_argument('--max_concurrent_computation_calls', type=int, default=-1,
                      help='passed to the worker (-1: no limit)')
  parser.add_argument('--binary', default='', help='a worker_binary of your own (e.g. built with CUDA)')
  args = parser.parse_args(argv)
  unix = args.bind.startswith('unix:')
  if unix and not os.path.isabs(args.bind[len('unix:'):]):
    print(f'error: --bind={args.bind} needs an absolute path: unix:/path/to/socket',
          file=sys.stderr)
    return 2
  if not unix and not 0 < args.port < 65536:
    print(f'error: --port must be in 1..65535, got {args.port}', file=sys.stderr)
    return 2
  isolation = _isolation_module()
  exposed = args.bind in _EVERY_INTERFACE
  port = args.port if exposed else isolation.NAMESPACE_PORT
  command = isolation.worker_command(port, args.max_concurrent_computation_calls)
  if args.binary:
    command[0] = args.binary
  if not os.access(command[0], os.X_OK):
    print(f'error: no executable worker binary at {command[0]}; install TFF 0.87 '
          '(bash scripts/setup.sh) or pass --binary', file=sys.stderr)
    return 2
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  if exposed:
    print(f'TFF executor service on port {args.port} of every interface (unauthenticated: '
          f'anyone who reaches it can run code as this user): {" ".join(command)}', flush=True)
    os.execv(command[0], command)
  reason = isolation.isolation_unavailable()
  if reason is not None:
    print(f'error: cannot bind the worker to {args.bind} here ({reason}): the binary itself '
          f'listens on every interface; {isolation.ISOLATION_FIX}, or pass --bind=0.0.0.0 '
          'on a network you trust', file=sys.stderr)
    return 2
  listen = args.bind if unix else (
      f'[{args.bind}]:{args.port}' if ':' in args.bind else f'{args.bind}:{args.port}')
  print(f'TFF executor service at {listen}: {" ".join(command)}', flush=True)
  try:
    return isolation.serve_isolated(listen, command)
  except OSError as e:
    print(f'error: cannot listen at {listen}: {e.strerror or e}; choose another --port or '
          '--bind', file=sys.stderr)
    return 2


if __name__ == '__main__':
  sys.exit(main())
