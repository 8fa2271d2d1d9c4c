"""The methods of the training program, found by their names: one file per method.

`programs/methods/<method>.py` declares its `--algorithm`: its own flags (name, default,
help, validation rule and where the value goes: a keyword of its builder, a field of the
builder's `client_stages` (a `tff_algos.ClientStages`), a keyword of FedLEx's exploration
builder, or the program's loop), the general server flags it reads, its checks,
its summary entries, and how its builder (imported by name in that file, when a process is
built) is called. FedLEx's four variants share `fedlex.py`, the five baselines
`baselines.py`. The machinery they use (`Flag`, `Method`, the validation rules) and the
general flags every method takes (the plug-in client stages and FedLEx's exploration) are in
`registry.py`; `option_table.py` writes docs/methods.md's option table
(`python -m programs.methods` rewrites it; tests/test_method_flags.py checks the page holds
it).

This index collects them: `programs/train.py` defines the absl flags from it,
`programs/experiment_config.py` validates and refuses ignored flags,
`programs/computations.py` builds the process from it, and the flag tests iterate over it. A
new method is one module in tff_algos, one file here (added to `METHODS` below) and its
tests.

Modules:

* `baselines`: `fedavg`, `fedavgm`, `fedadam`, `fedprox`, `fedsgd`: their builder calls and
  the general flags each reads.
* `cadis`: `--algorithm=cadis`: its flags, checks, summary entries and builder call.
* `fedcda`: `--algorithm=fedcda`: its flags, checks, note, summary entries and builder call.
* `fedcross`: `--algorithm=fedcross`: its flags, checks and builder call.
* `fedlex`: FedLEx's four variants, guided presets of one builder.
* `option_table`: docs/methods.md's option table, generated from the registry; `__main__`
  (`python -m programs.methods`) rewrites it.
* `registry`: `Flag`, `Method`, the validation rules, the general flags.
* `scaffold`: `--algorithm=scaffold`: its flags, checks, summary entries and builder call.

Importing this package imports neither TensorFlow nor TFF (flags are validated before TF
starts).
"""

from __future__ import annotations

import dataclasses

from programs.methods import baselines
from programs.methods import cadis
from programs.methods import fedcda
from programs.methods import fedcross
from programs.methods import fedlex
from programs.methods import registry
from programs.methods import scaffold

# Every --algorithm, in the order of `--help`, of docs/methods.md's table and of the
# config's fields.
METHODS = {m.name: m for m in (
    baselines.METHODS + (fedcross.METHOD, fedcda.METHOD, cadis.METHOD, scaffold.METHOD)
    + fedlex.METHODS)}
ALGORITHMS = tuple(METHODS)
BASELINE_ALGORITHMS = tuple(m.name for m in baselines.METHODS)
FEDLEX_ALGORITHMS = tuple(m.name for m in fedlex.METHODS)


def all_flags() -> tuple:
  """Every method's own flag once, in declaration order (docs/methods.md's table)."""
  seen = {}
  for method in METHODS.values():
    for flag in method.flags:
      seen.setdefault(flag.name, flag)
  return tuple(seen.values())


def registry_flags() -> tuple:
  """Every flag the registry declares: the methods' own, the plug-ins' and the
  exploration's (the last two are general flags, documented in docs/training_program.md)."""
  return all_flags() + registry.PLUGIN_FLAGS + registry.FEDLEX_FLAGS


def config_fields() -> list:
  """(name, type, dataclasses.field) of every flag the registry declares, for
  ExperimentConfig."""
  return [(f.name, type(f.default), dataclasses.field(default=f.default))
          for f in registry_flags()]


def define_absl_flags() -> dict:
  """Defines every flag the registry declares with absl; returns {name: FlagHolder}."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
            str: flags.DEFINE_string}
  return {f.name: define[type(f.default)](f.name, f.default, f.help) for f in registry_flags()}
