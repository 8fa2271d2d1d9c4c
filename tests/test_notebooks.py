"""The notebooks (notebooks/run.py executes them): the committed outputs come from the
committed code, that code runs top to bottom at CI scale, and a killed kernel leaves no TFF
worker behind."""

import importlib.util
import os
import signal
import time

import nbformat
import pytest

from tests.helpers import process_alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(ROOT, 'notebooks')
_spec = importlib.util.spec_from_file_location('notebook_runner', os.path.join(NOTEBOOK_DIR, 'run.py'))
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)


def _read(name):
  return nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4)


def _errors(notebook):
  return [out for cell in notebook.cells if cell.cell_type == 'code'
          for out in cell.get('outputs', []) if out.get('output_type') == 'error']


def _text(notebook):
  return '\n'.join(out.get('text', '') for cell in notebook.cells if cell.cell_type == 'code'
                   for out in cell.get('outputs', []) if out.get('output_type') == 'stream')


def test_the_code_digest_sees_code_edits_only():
  notebook = _read(runner.NOTEBOOKS[0])
  digest = runner.code_digest(notebook)
  markdown = next(c for c in notebook.cells if c.cell_type == 'markdown')
  markdown.source += '\nprose edits do not change the code'
  assert runner.code_digest(notebook) == digest
  code = next(c for c in notebook.cells if c.cell_type == 'code')
  code.source += '\n'
  assert runner.code_digest(notebook) != digest


@pytest.mark.parametrize('name', runner.NOTEBOOKS)
def test_committed_outputs_come_from_a_full_run_of_the_committed_code(name):
  notebook = _read(name)
  stamp = notebook.metadata.get(runner.METADATA_KEY, {})
  assert stamp.get('scale') == 'full', f'{name}: run `python notebooks/run.py {name}`'
  assert stamp.get('code_sha256') == runner.code_digest(notebook), (
      f'{name}: code cells changed after its outputs were made; run `python notebooks/run.py {name}`')
  counts = [c.execution_count for c in notebook.cells if c.cell_type == 'code']
  assert counts == list(range(1, len(counts) + 1)), 'not executed top to bottom in one kernel'
  assert not _errors(notebook)
  figures = runner.figure_cells(notebook)
  assert figures and all(runner.has_image(c) for c in figures)
  assert 'fashion_mnist' in _text(notebook)  # the full scale, not the CI one


@pytest.mark.parametrize('name', runner.NOTEBOOKS)
def test_notebook_runs_top_to_bottom_at_ci_scale(name):
  executed, _ = runner.execute(os.path.join(NOTEBOOK_DIR, name), 'ci', timeout=900)
  assert not _errors(executed)  # nbclient also raises on the first failing cell
  figures = runner.figure_cells(executed)
  assert len(figures) == len(runner.figure_cells(_read(name)))
  assert all(runner.has_image(c) for c in figures)
  text = _text(executed)
  assert 'digits' in text and 'fashion_mnist' not in text  # the scale parameter reached the kernel


@pytest.mark.parametrize('how', ['SIGKILL', 'shutdown'])
def test_ending_the_kernel_leaves_no_worker(how, monkeypatch):
  from jupyter_client.manager import start_new_kernel  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '3')
  setup = next(c.source for c in _read(runner.NOTEBOOKS[0]).cells if c.cell_type == 'code')
  probe = ('@tff.federated_computation\n'
           'def three():\n'
           '  return tff.federated_value(np.int32(3), tff.SERVER)\n'
           'print("workers", three(), *execution.worker_pids())\n')
  km, kc = start_new_kernel(kernel_name='python3', cwd=NOTEBOOK_DIR, startup_timeout=120)
  printed = []
  try:
    reply = kc.execute_interactive(
        setup + '\n' + probe, timeout=300,
        output_hook=lambda msg: printed.append(msg['content'].get('text', '')))
    assert reply['content']['status'] == 'ok', reply['content']
    line = next(t for t in ''.join(printed).splitlines() if t.startswith('workers'))
    workers = [int(p) for p in line.split()[2:]]
    assert line.split()[1] == '3' and workers and all(process_alive(p) for p in workers)
    if how == 'SIGKILL':  # no atexit, no cleanup: only PR_SET_PDEATHSIG can stop the worker
      os.kill(km.provisioner.process.pid, signal.SIGKILL)
    else:  # Jupyter's "Shut Down Kernel"
      km.shutdown_kernel(now=False)
    deadline = time.time() + 30
    while any(process_alive(p) for p in workers) and time.time() < deadline:
      time.sleep(0.2)
    assert not any(process_alive(p) for p in workers), f'worker(s) {workers} outlived the kernel'
  finally:
    kc.stop_channels()
    if km.has_kernel:
      km.shutdown_kernel(now=True)
