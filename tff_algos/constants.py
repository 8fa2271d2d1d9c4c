"""Names shared by tff_algos and the programs, kept free of TensorFlow: the training program
reads them before its flags are checked, when nothing may start TensorFlow yet."""

# One client's input, the one element of its sequence (docs/architecture.md, "Client
# identity"): its inputs x and labels y (their dtypes and shapes the model's), then the fields
# every client input carries, as (name, NumPy dtype, shape): its per-epoch sample orders
# [epochs, n], its index, its slot in the round's sample, and its work (0 = it never reports;
# else the share of its local steps it runs). data/round_sampling.py writes it,
# client_work/local_training.py and data/client_data_adapter.py type it.
CLIENT_INPUT_FIELDS = (('order', 'int32', (None, None)), ('index', 'int32', ()),
                       ('slot', 'int32', ()), ('work', 'float32', ()))

# The four figures over clients of the per-client evaluation, in
# `evaluation.summarize_client_accuracies`' order (the program's metrics.csv columns).
CLIENT_ACCURACY_FIGURES = ('client_accuracy_mean', 'client_accuracy_std',
                           'client_accuracy_p10', 'client_accuracy_min')

# The allowed values of the methods' options, defined here once: the builders refuse any
# other, and the training program's flags offer these (programs/methods/).

# FedCross (docs/algorithms.md#fedcross): the collaborator rules, the similarity of the
# similarity rules, and alpha, the weight of a model's own upload in CrossAggr: in
# [0.5, 1) as in the paper (at 1 models never mix; below 0.5 a model keeps less of itself
# than of its collaborator).
FEDCROSS_SELECTIONS = ('lowest_similarity', 'highest_similarity', 'in_order')
FEDCROSS_SIMILARITIES = ('model', 'layerwise')
FEDCROSS_ALPHA_MIN = 0.5  # included
FEDCROSS_ALPHA_MAX = 1.0  # excluded
FEDCROSS_ALPHA_INTERVAL = f'[{FEDCROSS_ALPHA_MIN:g}, {FEDCROSS_ALPHA_MAX:g})'


def fedcross_alpha_is_valid(alpha) -> bool:
  """Whether `alpha` lies in FEDCROSS_ALPHA_INTERVAL."""
  return FEDCROSS_ALPHA_MIN <= alpha < FEDCROSS_ALPHA_MAX


# FedCDA (docs/algorithms.md#fedcda): the cache's selection rules, the warmup FedAvg's
# client weights, and the dtypes a cache may hold with their bytes per weight.
FEDCDA_SELECTIONS = ('batch_greedy', 'exact', 'newest', 'random')
FEDCDA_WARMUP_WEIGHTINGS = ('data_size', 'uniform')
FEDCDA_CACHE_DTYPES = {'float32': 4, 'float16': 2, 'bfloat16': 2}

# The client weights of a model-delta mean (SCAFFOLD's --scaffold_client_weighting).
CLIENT_WEIGHTINGS = ('uniform', 'num_examples')

# CADIS's knowledge distillation (any method's KD plug-in): the reduction of the KD term
# and the divisor of the kernel's sigma^2; its clustering: the layer whose delta is compared
# and how clusters close over pairs.
KD_REDUCTIONS = ('sum', 'mean')
KD_STDS = ('population', 'sample')
CADIS_SIMILARITY_LAYERS = ('bias', 'kernel')
CADIS_CLOSURES = ('two_hop', 'components', 'oracle')

# FedLEx (docs/algorithms.md#fedlex): how the guidance is normalised, and where the
# program's guidance comes from.
FEDLEX_NORMALIZATIONS = ('per_client', 'after_mean')
FEDLEX_GUIDANCES = ('exploration', 'placeholder')
