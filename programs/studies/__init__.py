"""Studies: methods x settings x seeds, tuned, resumed and compared over paired seeds.

A study file (TOML) declares them; `python -m programs.study` runs, tunes, plans and reports
them. `declaration.Study` is the declaration; the modules beside it load it from a file,
make its runs and write its page.

Modules (docs/architecture.md has the whole map):

* `command_flags`: `--only`, the flag `programs.study` and `benchmarks.compare` share,
  defined once.
* `curves`: accuracy curves over seeds, one panel per baseline, written byte for byte alike.
* `declaration`: `Study` and `Comparison`, what a study file declares: its runs' trainer
  flags, seeds, comparisons, tuning grids and where its runs live.
* `paired`: paired statistics over seeds: the seeds runs share, per-seed margins, the 95%
  paired t interval, what n seeds resolve, and the cells and table rows the pages write from
  them.
* `queue`: the run queue: finished runs skipped, stopped ones resumed, runs shared by two
  processes, stop signals, the plan's time estimate.
* `records`: reading one run directory: its curve, headline figures, rows.
* `study_configs`: a study's runs and tuning points as `ExperimentConfig`s.
* `study_file`: a study file read and checked: one line naming file, table and key for each
  mistake.
* `study_page`: a study's page: results.md, results.json, curves.png.
* `tuning`: the grids on the tuning seed, the choice frozen in tuned.json and checked before
  a run.
"""
