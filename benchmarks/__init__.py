"""The papers' reproduction suites, their pages, diagnoses and micro-benchmarks.

Modules (docs/architecture.md has the whole map):

* `cadis_diagnosis`: CADIS's weights, clusters and KD term on cluster-MC.
* `checkpoint_cost`: RESULTS.md's tables of what checkpoints add to a round, from
  `round_overhead`'s JSON logs.
* `client_training_vs_pytorch`: client training, our round as the program runs it and plain
  TF against a PyTorch simulator's round on the same clients (`torch_twins` runs the PyTorch
  side); `--profile`: where a TF client epoch's time goes (`epoch_profile`).
* `clients_per_round`: round time against clients per round, ours and TFF's.
* `clients_together`: a round's clients trained together over stacked weights, checked
  against each trained alone; what pfor batches.
* `compare`: runs a suite over its seeds (on `programs/studies/queue.py`) and writes its
  results page.
* `fedcda_cache_precision`: FedCDA's cache in float16 / bfloat16 against float32.
* `fedcda_diagnosis`: where FedCDA's margin over FedAvg comes from.
* `epoch_profile`: one TF client epoch profiled: time by op type, the framework's overhead.
* `fedavg_rounds`: the FedAvg rounds the timing benchmarks share: the clients, a plain-TF
  loop, our resident process run as the program runs it.
* `fedcross_diagnosis`: FedCross's models' spread and collaborator choices.
* `federations`: every method with clients that drop out or lag, in rounds and bytes: its
  runs are the study file `benchmarks/studies/federations.toml`, its page
  `benchmarks/results/federations/`.
* `fedlex_diagnosis`: what FedLEx's guidance G is and how far it scales steps.
* `fedprox_pull`: how far FedProx's proximal term moves a round's update.
* `method_builds`: each method's process as the training program builds it, for the
  measurements.
* `parallel_runs`: two runs side by side, default thread pools against one thread.
* `protobuf_cost`: protobuf's compiled against pure-Python implementation under TFF.
* `report`: writes every reproduction page from the committed runs.
* `round_overhead`: seconds per round against a tight plain-TF loop.
* `server_scale`: CADIS's and FedCDA's server step against N.
* `study`: `programs.study` for the papers' study files (benchmarks/studies/), with the
  paper layer's page writers (their `report` key) lent to it: programs never import
  benchmarks.
* `suite_runs`: the one reader of the suites' run directories (one run's reading is
  `programs/studies/records.py`'s).
* `torch_twins`: the zoo models' PyTorch twins and a PyTorch simulator's round (runs only in
  an interpreter with PyTorch, as a child process).
* `suites`: the papers' comparisons declared once: settings, runs, seeds, grids, paper
  figures.
* `value_transfer`: the cost of moving a value through TFF's local runtime.
* `version_writes`: a checkpoint version's write, by when the oldest version is removed.
* `worker_memory`: TFF's worker memory over rounds with resident state.
"""
