"""The programs: `train` (one run) and `study` (a study file's runs), and what they share.

Modules (docs/architecture.md has the whole map):

* `checkpoint_writer`: checkpoints off the round loop's critical path (the worker writes a
  resident state's version while the next round runs, the next checkpoint waits for it, a
  background thread completes it), and the one-line errors of a write that fails.
* `computations`: a run's TFF computations (process, optimizers, evaluations), their runtime
  checks and the cache a rerun reuses.
* `experiment`: the training loop behind it, in named steps: data, computations, resume or
  start, rounds, results.
* `experiment_config`: `ExperimentConfig` (every flag), the defaults, validation, and each
  flag's role (may it change on `--resume`, does it rebuild the computations).
* `fedlex_exploration`: FedLEx's exploration within a run: explorers, the initial guidance,
  its refresh each round.
* `flag_parsing`: absl's flag errors (a bad value, an unknown flag) as one `error:` line,
  exit 2, before TensorFlow starts, for every binary.
* `generated_files`: writing generated text: atomic replacement, blocks between markers.
* `lr_schedules`: the learning-rate schedule flags, their validation and the schedules they
  make.
* `methods`: the method registry, one file per method: each `Method`, its flags, validation
  and builder arguments.
* `run_directory`: the experiment directory: its lock, files, checkpoints and their
  clean-up, the resume point (the newest readable checkpoint), TensorBoard truncation.
* `run_results`: what a run reports: metrics.csv's rows, summary.json, accuracy.png, final
  weights.
* `stopping`: when a run stops early: stop signals, diverged training, blown-up local
  training.
* `study`: the second binary: a user's own study from its file: `run`, `tune`, `plan`,
  `report`.
* `train`: the absl binary: any method on any dataset and partition.
* `user_code`: a model, data set or method of the user's, named by an import path: resolved,
  checked before TensorFlow starts, and fingerprinted in config.json and summary.json.
* `studies`: the studies package: a study file's methods x settings x seeds, run, tuned,
  planned and reported.
"""
