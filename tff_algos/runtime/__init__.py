"""TFF 0.87 runtime workarounds: this package goes on a TFF upgrade (check each against it).

What TFF 0.87's runtime lacks or gets wrong, one concept a module:

* `workers`: the C++ `worker_binary` processes' lifecycle: `WorkerService`, each worker
  dying with its parent, found and stopped at exit.
* `isolation`: a worker started isolated from the network (it serves unauthenticated gRPC
  on every interface) and the relay that reaches it (standard library only:
  scripts/start_worker.py loads it by path, and it runs as the relay).
* `serialization`: how values cross to the worker: a serializer that builds a nested
  value's message in place, and the largest value that can cross.
* `contexts`: the execution contexts: local, over several worker services, for
  `tff.program` code; the device probe; the shutdown at exit.
* `collector`: Python's garbage collector kept out of the TFF calls.
* `resident_state`: a LearningProcess whose server state stays in the worker.
* `state_transfer`: how that state crosses between Python and the worker: files the worker
  or Python writes, or TFF values in chunks.
* `saved_model_template`: tff.program checkpoint versions whose tensors the worker writes.
* `bundle_parts`: a TensorFlow bundle written in parts, only the parts that changed.

Importing this package, `workers`, `isolation`, `serialization`, `contexts` or `collector`
does not import TensorFlow (tests/test_layers.py); `resident_state`, `state_transfer`,
`saved_model_template` and `bundle_parts` do.
The public names are in `tff_algos.execution`, `tff_algos.ResidentProcess`.
"""
