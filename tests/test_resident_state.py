"""tff_algos.ResidentProcess: the server state stays in TFF's worker between rounds, and every
method's rounds give what `process.next` gives (weights, whole state, metrics)."""

import csv
import dataclasses
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import functools  # pylint: disable=g-import-not-at-top

import numpy as np
import pytest
import tensorflow as tf

from tff_algos import data
from programs import computations
from programs import experiment
from programs import experiment_config
from programs import fedlex_exploration
from programs import methods
from programs import run_directory
from tests import helpers
from tff_algos import fedlex
from tff_algos import models
from tff_algos.runtime import resident_state
from tff_algos.runtime import state_transfer

MODEL_FN = models.make_model_fn('tiny_cnn', (8, 8, 1), 10, seed=0)
NUM_CLIENTS, P, ROUNDS = 8, 4, 3


pytestmark = pytest.mark.usefixtures('runtime')


def _config(algorithm):
  return experiment_config.ExperimentConfig(
      algorithm=algorithm, dataset='digits', num_clients=NUM_CLIENTS, clients_per_round=P,
      batch_size=16, client_lr=0.1, local_epochs=1, fedcda_warmup_rounds=1, fedcda_batches=2,
      fedlex_exploration_epochs=1, **helpers.METHOD_SETTINGS.get(algorithm, {}))


@functools.lru_cache(maxsize=None)
def _fed():
  return experiment.load_federated_data(_config('fedavg'))


@functools.lru_cache(maxsize=None)
def _process(algorithm):
  """The process of `algorithm`; 'fedcda@bfloat16': FedCDA with its cache in bfloat16."""
  name, _, cache_dtype = algorithm.partition('@')
  config = _config(name)
  if cache_dtype:
    config = dataclasses.replace(config, fedcda_cache_dtype=cache_dtype)
  return computations.build_process(config, MODEL_FN, NUM_CLIENTS)


def _inputs(round_num):
  _, inputs = data.round_inputs(_fed(), round_num, P, 1, 0)
  return [[x] for x in inputs]


def _initial_state(algorithm, process):
  """The program's initial state (FedLEx: after its exploration, computed in Python)."""
  state = process.initialize()
  if algorithm in methods.FEDLEX_ALGORITHMS:
    exploration, explorers = fedlex_exploration.exploration_computation(
        _config(algorithm), MODEL_FN, NUM_CLIENTS)
    _, inputs = data.round_inputs(_fed(), 0, len(explorers), 1, 1, client_ids=explorers)
    state, _ = fedlex.explore_and_initialize(process, exploration, [[x] for x in inputs], state)
  return state


def _assert_close(expected, actual):
  expected, actual = tf.nest.flatten(expected), tf.nest.flatten(actual)
  assert len(expected) == len(actual)
  def comparable(x):   # (numpy's allclose takes no bfloat16)
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.name == 'bfloat16' else x
  for e, a in zip(expected, actual):
    np.testing.assert_allclose(comparable(a), comparable(e), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('algorithm',
                         ['fedavg', 'fedcross', 'fedcda', 'cadis', 'fedlex_avgm', 'scaffold'])
def test_rounds_match_process_next(algorithm):
  process = _process(algorithm)
  state = _initial_state(algorithm, process)
  # refresh_every=2: round 2's state is placed anew (module doc); every round's is detached.
  resident = resident_state.ResidentProcess(process, P, refresh_every=2)
  assert resident._detached_fields == len(state)  # pylint: disable=protected-access
  # FedLEx's exploration sets the state in Python: it is adopted; the others start in the
  # worker.
  held = (resident.adopt(state) if algorithm in methods.FEDLEX_ALGORITHMS
          else resident.initialize())
  for round_num in range(1, ROUNDS + 1):
    output = process.next(state, _inputs(round_num))
    state = output.state
    held, metrics = resident.next(held, _inputs(round_num))
    assert isinstance(held, resident_state.ResidentValue)
    _assert_close(output.metrics, metrics)
    assert list(metrics) == list(output.metrics)
  _assert_close(process.get_model_weights(state), resident.get_model_weights(held))
  assert isinstance(resident.get_model_weights(held), type(process.get_model_weights(state)))
  _assert_close(state, resident.materialize(held))


def test_a_state_materialized_and_adopted_continues_exactly():
  """What a checkpoint does: the state leaves the worker, comes back, and the rounds go on
  as if it had stayed (also into a new ResidentProcess, as after a restart)."""
  process = _process('fedcda')
  resident = resident_state.ResidentProcess(process, P)
  held = resident.initialize()
  for round_num in (1, 2):
    held, _ = resident.next(held, _inputs(round_num))
  saved = resident.materialize(held)
  unbroken, _ = resident.next(held, _inputs(3))
  again = resident_state.ResidentProcess(process, P)
  resumed, _ = again.next(again.adopt(saved), _inputs(3))
  _assert_close(resident.materialize(unbroken), again.materialize(resumed))
  # A plain Python state is adopted on the fly.
  direct, _ = resident.next(saved, _inputs(3))
  _assert_close(resident.materialize(unbroken), resident.materialize(direct))


def test_a_snapshot_read_in_another_thread_while_rounds_go_on_is_the_state():
  """`snapshot` (what the program's checkpoint does): the worker writes the state now, and
  the function it returns, run in another thread while the next rounds run and the state is
  dropped, gives the state `materialize` gives, to the bit; its file goes with the function."""
  import threading  # pylint: disable=g-import-not-at-top
  process = _process('fedcda')
  resident = resident_state.ResidentProcess(process, P)
  held = resident.initialize()
  held, _ = resident.next(held, _inputs(1))
  read = resident.snapshot(held)
  expected = resident.materialize(held)
  scratch = resident._scratch  # pylint: disable=protected-access
  assert len(os.listdir(scratch)) == 2   # the state's checkpoint: its index and data
  del held
  read_back = []
  reader = threading.Thread(target=lambda: read_back.append(read()))
  reader.start()
  held2, _ = resident.next(resident.initialize(), _inputs(1))
  held2, _ = resident.next(held2, _inputs(2))
  reader.join()
  for e, a in zip(tf.nest.flatten(expected), tf.nest.flatten(read_back[0]), strict=True):
    np.testing.assert_array_equal(np.asarray(e), np.asarray(a))
  assert type(read_back[0]) is type(expected)
  del read, reader
  import gc  # pylint: disable=g-import-not-at-top
  gc.collect()
  assert not os.listdir(scratch)
  # A state placed from Python is not written again: the snapshot is that state.
  placed = resident.adopt(expected)
  assert resident.snapshot(placed)() is expected


def test_a_write_started_while_rounds_go_on_is_the_state(tmp_path):
  """`write(..., wait=False)` (what the program's checkpoint does) returns a WriteInFlight
  at once; the worker writes while the next rounds run and Python drops the state; once
  waited for, the file holds the state `materialize` gives, to the bit. A second wait
  returns at once."""
  process = _process('fedcda')
  resident = resident_state.ResidentProcess(process, P)
  held = resident.initialize()
  held, _ = resident.next(held, _inputs(1))
  expected = resident.materialize(held)
  path = str(tmp_path / 'state')
  written = resident.write(held, path, state_transfer.state_file_layout(resident.state_type),
                           wait=False)
  assert isinstance(written, resident_state.WriteInFlight)
  del held
  held2, _ = resident.next(resident.initialize(), _inputs(1))
  held2, _ = resident.next(held2, _inputs(2))
  written.wait()
  written.wait()
  leaves = state_transfer.read_state_file(path, resident.state_type)
  for e, a in zip(state_transfer.state_leaves(expected, resident.state_type), leaves,
                  strict=True):
    assert np.asarray(e).dtype == a.dtype
    assert np.asarray(e).tobytes() == a.tobytes()
  assert resident.write(held2, str(tmp_path / 'now'),
                        state_transfer.state_file_layout(resident.state_type)) is None
  assert os.path.exists(str(tmp_path / 'now.index'))


@pytest.mark.parametrize('algorithm', ['fedcda', 'fedcross', 'fedcda@bfloat16'])
def test_every_way_the_state_crosses_gives_the_same_state(algorithm):
  """The state crosses between Python and the worker as a checkpoint file (transfer='files',
  the default), as one TFF value, or above `chunk_bytes` in chunks (each a message of its own):
  what comes back is the same state, to the bit and in the same containers, and rounds on a
  state placed any way go on exactly."""
  process = _process(algorithm)
  whole = resident_state.ResidentProcess(process, P, transfer='values', chunk_bytes=0)
  ways = dict(chunks=resident_state.ResidentProcess(process, P, transfer='values',
                                                    chunk_bytes=4096),
              files=resident_state.ResidentProcess(process, P))
  assert len(ways['chunks']._chunks) > 3  # pylint: disable=protected-access
  assert ways['files']._chunks is None  # pylint: disable=protected-access
  held = whole.initialize()
  for round_num in (1, 2):
    held, _ = whole.next(held, _inputs(round_num))
  state = whole.materialize(held)
  unbroken = whole.materialize(whole.next(held, _inputs(3)).state)
  for way, resident in ways.items():
    placed = resident.adopt(state)
    placed._python = None   # pylint: disable=protected-access  (fetch it back, that way)
    back = resident.materialize(placed)
    tf.nest.assert_same_structure(state, back)
    assert type(back) is type(state), way
    for a, b in zip(tf.nest.flatten(state), tf.nest.flatten(back)):
      assert type(a) is type(b) and np.asarray(a).dtype == np.asarray(b).dtype, way
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    resumed, _ = resident.next(placed, _inputs(3))
    _assert_close(unbroken, resident.materialize(resumed))
  assert state_transfer.state_chunks(process.initialize.type_signature.result.member,
                                     1 << 40) is None
  if algorithm == 'fedcda@bfloat16':
    assert str(process.initialize.type_signature.result.member.aggregator.cache[0].dtype) == 'bfloat16'


def test_a_state_that_does_not_fit_its_type_is_refused_by_name():
  """Placed from Python through a file, a state is held to TFF's own rules for a value sent
  to the worker: each tensor's dtype and shape, and their number."""
  process = _process('fedcda')
  resident = resident_state.ResidentProcess(process, P)
  state = process.initialize()
  leaves = tf.nest.flatten(state)
  member = process.initialize.type_signature.result.member
  widened = [np.asarray(x, np.float64) if np.asarray(x).dtype == np.float32 else x
             for x in leaves]
  with pytest.raises(ValueError, match=r"tensor 0 \(float64\) does not fit its type float32"):
    state_transfer.write_state_file('/nonexistent/x', widened, member)
  with pytest.raises(ValueError, match=f'the state has {len(leaves) - 1} tensors; its type has'):
    state_transfer.write_state_file('/nonexistent/x', leaves[:-1], member)
  reshaped = [np.zeros([2]) if i == 0 else x for i, x in enumerate(leaves)]
  with pytest.raises(ValueError, match='tensor 0 .*does not fit|tensor 0 has shape'):
    state_transfer.write_state_file('/nonexistent/x', reshaped, member)
  with pytest.raises(ValueError, match='tensor 0 has shape'):
    state_transfer.write_state_file(
        '/nonexistent/x', [np.zeros([2], np.float32) if i == 0 else x
                           for i, x in enumerate(leaves)], member)
  resident.close()
  with pytest.raises(ValueError, match='this ResidentProcess is closed'):
    resident.adopt(state)


@pytest.mark.parametrize('transfer', state_transfer.TRANSFERS)
@pytest.mark.parametrize('refresh_every, refreshed', [
    (2, [False, True, False, True]), (3, [False, False, True, False]),
    (0, [False, False, False, False])])
def test_the_state_is_placed_anew_every_n_rounds(transfer, refresh_every, refreshed):
  """Every `refresh_every` rounds the new state is placed in the worker anew (so the worker
  can free the earlier rounds), by a file the worker writes and reads (transfer='files') or
  through Python ('values'); the rounds are those without refreshes."""
  process = _process('fedavg')
  resident = resident_state.ResidentProcess(process, P, refresh_every=refresh_every,
                                            transfer=transfer)
  never = resident_state.ResidentProcess(process, P, refresh_every=0, transfer=transfer)
  calls = []
  refresh = resident.refresh
  resident.refresh = lambda state: calls.append(state) or refresh(state)
  held, plain, seen = resident.initialize(), never.initialize(), []
  for round_num in range(1, 5):
    calls.clear()
    held, _ = resident.next(held, _inputs(round_num))
    plain, _ = never.next(plain, _inputs(round_num))
    seen.append(bool(calls))
    if calls:
      assert held is not calls[0]
    _assert_close(never.materialize(plain), resident.materialize(held))
  assert seen == refreshed
  if transfer == 'files':   # nothing left behind but the last materialized state's file
    assert len(os.listdir(resident._scratch)) <= 2  # pylint: disable=protected-access


def test_a_refresh_right_after_materialize_reads_its_file(monkeypatch):
  """The program's checkpoint rounds: `materialize` has the worker write the state, and a
  `refresh` of that state only reads the file back (no second write)."""
  process = _process('fedcda')
  resident = resident_state.ResidentProcess(process, P, refresh_every=0)
  held, _ = resident.next(resident.initialize(), _inputs(1))
  saves = []
  real_save = resident._save  # pylint: disable=protected-access
  monkeypatch.setattr(resident, '_save', lambda *a: saves.append(1) or real_save(*a))
  state = resident.materialize(held)
  refreshed = resident.refresh(held)
  assert len(saves) == 1 and refreshed is not held
  assert os.listdir(resident._scratch) == []  # pylint: disable=protected-access
  _assert_close(state, resident.materialize(refreshed))
  assert resident.refresh(resident.adopt(state))._python is state  # pylint: disable=protected-access
  _assert_close(resident.materialize(resident.next(held, _inputs(2)).state),
                resident.materialize(resident.next(refreshed, _inputs(2)).state))
  assert len(saves) == 4
  scratch = resident._scratch  # pylint: disable=protected-access
  assert os.listdir(scratch)   # the last materialized state's file
  resident.close()
  assert not os.path.exists(scratch)


def test_misuse_is_refused_with_the_reason():
  process = _process('fedavg')
  resident = resident_state.ResidentProcess(process, P)
  with pytest.raises(ValueError, match=f'rounds of {P} clients; got {P - 1}'):
    resident.next(resident.initialize(), _inputs(1)[:-1])
  other = resident_state.ResidentProcess(process, P)
  with pytest.raises(ValueError, match='held by another ResidentProcess'):
    other.next(resident.initialize(), _inputs(1))
  with pytest.raises(TypeError, match='needs TFF\'s local runtime'):
    resident_state.ResidentProcess(process, P, context=object())
  with pytest.raises(ValueError, match='clients_per_round must be >= 1'):
    resident_state.ResidentProcess(process, 0)
  with pytest.raises(ValueError, match='refresh_every must be >= 0'):
    resident_state.ResidentProcess(process, P, refresh_every=-1)
  with pytest.raises(ValueError, match='chunk_bytes must be >= 0'):
    resident_state.ResidentProcess(process, P, chunk_bytes=-1)
  with pytest.raises(ValueError, match="transfer must be one of .*got 'disk'"):
    resident_state.ResidentProcess(process, P, transfer='disk')
  placed = resident.adopt(process.initialize())
  with pytest.raises(ValueError, match='held by another ResidentProcess'):
    other.materialize(placed)
  layout = state_transfer.state_file_layout(resident.state_type)
  with pytest.raises(ValueError, match='held by another ResidentProcess'):
    other.write(placed, 'unused', layout)
  with pytest.raises(TypeError, match='write takes a ResidentValue, got LearningAlgorithmState'):
    resident.write(process.initialize(), 'unused', layout)
  by_values = resident_state.ResidentProcess(process, P, transfer='values')
  assert resident.writes_files and not by_values.writes_files
  with pytest.raises(ValueError, match='write needs transfer=\'files\''):
    by_values.write(by_values.initialize(), 'unused', layout)


def test_program_resident_state_flag(tmp_path, monkeypatch):
  """--resident_state (default) runs the program's rounds through ResidentProcess,
  --noresident_state through process.next; both give the same metrics and weights."""
  made = []

  class Recorded(resident_state.ResidentProcess):
    def __init__(self, *args, **kwargs):
      made.append(self)
      super().__init__(*args, **kwargs)

  monkeypatch.setattr(resident_state, 'ResidentProcess', Recorded)
  runs = {}
  for flag in (True, False):
    config = experiment_config.ExperimentConfig(
        algorithm='fedcda', dataset='digits', num_clients=NUM_CLIENTS, clients_per_round=P,
        batch_size=16, client_lr=0.1, fedcda_warmup_rounds=1, fedcda_batches=2, rounds=3,
        progress=False, resident_state=flag, root_output_dir=str(tmp_path),
        experiment_name=f'resident_{flag}')
    made.clear()
    runs[flag] = experiment.run_experiment(config)
    assert len(made) == (1 if flag else 0)
    runs[flag]['weights'] = np.load(os.path.join(config.experiment_dir, 'final_weights.npz'))
    with open(os.path.join(config.experiment_dir, 'metrics.csv'), newline='') as f:
      runs[flag]['csv'] = [{k: v for k, v in row.items() if k not in run_directory.TIMING_COLUMNS}
                           for row in csv.DictReader(f)]
  assert runs[True]['csv'] == runs[False]['csv']
  for name in runs[True]['weights'].files:
    np.testing.assert_array_equal(runs[True]['weights'][name], runs[False]['weights'][name])


def test_an_empty_state_crosses_without_a_file(tmp_path):
  """A state with no tensors: the worker writes no file and reads none back."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  state_type = tff.FederatedType(tff.StructType([]), tff.SERVER)
  path = str(tmp_path / 'state')
  state_transfer.save_computation(state_type)((), [path])
  assert os.listdir(tmp_path) == []
  restored, size = state_transfer.restore_computation(state_type)(path)
  assert len(restored) == 0 and size == 1
  assert state_transfer.read_state_file(path, state_type.member) == []
  state_transfer.write_state_file(path, [], state_type.member)
  assert os.listdir(tmp_path) == []


def test_a_state_without_fields_is_not_detached():
  """`detach_computations` needs a struct of fields to pick out and zip again."""
  import tensorflow_federated as tff  # pylint: disable=g-import-not-at-top
  assert resident_state.detach_computations(
      tff.FederatedType(tff.TensorType(np.float32, [3]), tff.SERVER)) is None
  assert resident_state.detach_computations(
      tff.FederatedType(tff.StructType([]), tff.SERVER)) is None


def test_a_detached_state_is_the_state():
  """The fields picked out and zipped again give the state itself (same values, same type)."""
  process = _process('fedcda')
  state = process.initialize()
  split, join = resident_state.detach_computations(process.initialize.type_signature.result)
  fields = split(state)
  assert bool(fields[-1])
  rejoined = join(fields[:-1])
  for a, b in zip(tf.nest.flatten(state), tf.nest.flatten(rejoined)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert type(rejoined) is type(state)


def test_a_state_that_cannot_be_detached_is_refreshed_every_10_rounds(monkeypatch):
  process = _process('fedavg')
  assert resident_state.ResidentProcess(process, P)._refresh_every == 0  # pylint: disable=protected-access
  monkeypatch.setattr(resident_state, 'detach_computations', lambda state_type: None)
  undetached = resident_state.ResidentProcess(process, P)
  assert undetached._detached_fields == 0  # pylint: disable=protected-access
  assert undetached._refresh_every == resident_state.UNDETACHED_REFRESH_ROUNDS == 10  # pylint: disable=protected-access


def test_each_round_sends_the_disposals_python_has_queued():
  """TFF's RemoteExecutor disposes of the worker's values in batches of 20; `next` sends
  what is queued at the start of each round (earlier rounds' states among it)."""
  process = _process('fedcda')
  resident = resident_state.ResidentProcess(process, P)
  stub = resident._executor._stub  # pylint: disable=protected-access
  sent, dispose = [], stub.dispose

  def recording_dispose(request):
    sent.append(len(request.value_ref))
    return dispose(request)

  stub.dispose = recording_dispose
  try:
    held = resident.initialize()
    for round_num in range(1, 4):
      held, _ = resident.next(held, _inputs(round_num))
  finally:
    stub.dispose = dispose
  assert len(sent) >= 2 and all(0 < n < 20 for n in sent), sent
