"""TFF 0.87 runtime workarounds: this package goes on a TFF upgrade (check each against it).

What TFF 0.87's runtime lacks or gets wrong, one concept a module:

* `workers`: the C++ `worker_binary` processes: started isolated from the network (it
  serves unauthenticated gRPC on every interface), dying with their parent, stopped at exit
  (standard library only: scripts/start_worker.py loads it by path).
* `serialization`: how values cross to the worker: a serializer that builds a nested
  value's message in place, and the largest value that can cross.
* `contexts`: the execution contexts: local, over several worker services, for
  `tff.program` code; the device probe; the shutdown at exit.
* `collector`: Python's garbage collector kept out of the TFF calls.
* `resident_state`: a LearningProcess whose server state stays in the worker.
* `state_transfer`: how that state crosses between Python and the worker (files or values).

Importing this package (and every module but `resident_state`) does not import TensorFlow.
The public names are in `tff_algos.execution`, `tff_algos.ResidentProcess`.
"""
