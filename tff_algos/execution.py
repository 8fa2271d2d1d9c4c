"""The runtime's public names: TFF's execution context, its workers, the value limits.

    from tff_algos import execution
    execution.initialize_runtime()   # before the first TFF call

Each name lives in `tff_algos.runtime` (TFF 0.87 workarounds, one concept a module); outside
the library this module is the one path into the runtime's contexts, workers, isolation,
serialization and collector. The server state's modules, which import TensorFlow
(`resident_state`, `state_transfer`, `saved_model_template`, `bundle_parts`), are imported
by their own names (public: `tff_algos.ResidentProcess`); tests/test_layers.py holds both
rules. Standard library only on import: `import tff_algos` registers the workers' shutdown
at exit through it.
"""

from tff_algos.runtime.collector import collector_paused, freeze_long_lived_objects
from tff_algos.runtime.contexts import (
    DEFAULT_WORKER_TIMEOUT_SECONDS, SLOW_PROTOBUF_WARNING, NotMergeableError,
    check_mergeable, distributed_context, initialize_runtime, installed_context,
    local_context, program_context, protobuf_implementation, shutdown_workers, worker_devices)
from tff_algos.runtime.serialization import (
    MAX_VALUE_BYTES, ValueTooLargeError, check_value_fits, install_value_serialization,
    serialize_value, value_bytes)
from tff_algos.runtime.isolation import (
    WorkerNotIsolatedError, isolation_unavailable, worker_binary_path, worker_command)
from tff_algos.runtime.workers import (
    WorkerService, WorkerUnavailableError, parse_worker_addresses, worker_pids)

__all__ = [
    'DEFAULT_WORKER_TIMEOUT_SECONDS', 'MAX_VALUE_BYTES', 'NotMergeableError',
    'SLOW_PROTOBUF_WARNING', 'ValueTooLargeError', 'WorkerNotIsolatedError', 'WorkerService',
    'WorkerUnavailableError', 'check_mergeable', 'check_value_fits', 'collector_paused',
    'distributed_context', 'freeze_long_lived_objects', 'initialize_runtime',
    'install_value_serialization', 'installed_context', 'isolation_unavailable',
    'local_context', 'parse_worker_addresses', 'program_context', 'protobuf_implementation',
    'serialize_value', 'shutdown_workers', 'value_bytes', 'worker_binary_path',
    'worker_command', 'worker_devices', 'worker_pids',
]
