"""CADIS's knowledge-distillation regulariser (client side).

λ·KL between the kernel pairwise-similarity distributions of the teacher's (the received
global model's) and the student's representations, the input of the final classifier
layer: docs/algorithms.md#cadis, "Client side". `build_kd_loss` computes the teacher's
representations once per client and round in inference mode, and taps the student's own
training forward pass, so KD costs no extra student pass. Numerics: distances in the Gram
form on batch-centred representations (memory O(m² + m·d)), a squared distance ≤ 1e-12
counted as 0 with zero gradient, p(j|i) in the log domain (no epsilon, no log(0)),
representations of rank > 2 flattened, the teacher under `tf.stop_gradient`. `reduction`: 'sum' (the reference
code's double sum) or 'mean' (over anchor examples); `std`: 'population' (σ² over the m(m−1)
ordered-pair distances) or 'sample' (over m(m−1) − 1, the authors' `torch.std`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import tensorflow as tf
import tensorflow_federated as tff

from tff_algos import constants
from tff_algos.models import representation

KERNEL_EPSILON = 1e-3
_MIN_SQUARED_DISTANCE = 1e-12
# Gap (in log space) below a row's smallest kernel value at which the excluded diagonal sits:
# exp(-200) is 0 in float32, so the diagonal contributes nothing to the row normaliser while
# every quantity stays finite (no -inf, hence no NaN gradients).
_DIAGONAL_GAP = 200.0


def _flatten(r) -> tf.Tensor:
  r = tf.cast(tf.convert_to_tensor(r), tf.float32)
  return tf.reshape(r, [tf.shape(r)[0], -1])


def pairwise_distances(representations) -> tf.Tensor:
  """[m, m] Euclidean distances between the rows of `representations` (rank >= 2, flattened).

  The diagonal is 0; a squared distance <= 1e-12 is treated as 0 (zero gradient).
  """
  r = _flatten(representations)
  r = r - tf.reduce_mean(r, axis=0, keepdims=True)  # distances are translation invariant
  norms = tf.reduce_sum(tf.square(r), axis=1)
  squared = norms[:, None] + norms[None, :] - 2.0 * tf.matmul(r, r, transpose_b=True)
  m = tf.shape(r)[0]
  off_diagonal = tf.logical_not(tf.eye(m, dtype=tf.bool))
  positive = tf.logical_and(off_diagonal, squared > _MIN_SQUARED_DISTANCE)
  safe = tf.where(positive, squared, tf.ones_like(squared))
  return tf.where(positive, tf.sqrt(safe), tf.zeros_like(squared))


def _check(reduction: str, std: str) -> None:
  if reduction not in constants.KD_REDUCTIONS:
    raise ValueError(f'kd_reduction must be one of {constants.KD_REDUCTIONS}, got {reduction!r}')
  if std not in constants.KD_STDS:
    raise ValueError(f'kd_std must be one of {constants.KD_STDS}, got {std!r}')


def log_conditional_probabilities(representations, std: str = 'population') -> tf.Tensor:
  """[m, m] log p(j|i) of the standardised Gaussian kernel over j != i (see module doc;
  `std`: 'population' or 'sample', the divisor of σ²).

  The diagonal holds a finite value far below the row's entries (p(i|i) is 0 in float32);
  callers mask it out.
  """
  d = pairwise_distances(representations)
  m = tf.shape(d)[0]
  off_diagonal = tf.logical_not(tf.eye(m, dtype=tf.bool))
  mask = tf.cast(off_diagonal, tf.float32)
  num_pairs = tf.cast(m * (m - 1), tf.float32)
  mu = tf.math.divide_no_nan(tf.reduce_sum(d * mask), num_pairs)
  var_divisor = num_pairs if std == 'population' else tf.maximum(num_pairs - 1.0, 0.0)
  var = tf.math.divide_no_nan(tf.reduce_sum(tf.square(d - mu) * mask), var_divisor)
  log_kernel = -0.5 * tf.square(d - mu) / (var + KERNEL_EPSILON)
  floor = tf.stop_gradient(tf.reduce_min(log_kernel)) - _DIAGONAL_GAP
  filled = tf.where(off_diagonal, log_kernel, tf.fill(tf.shape(log_kernel), floor))
  return filled - tf.reduce_logsumexp(filled, axis=1, keepdims=True)


def kde_similarity_kl(teacher_repr, student_repr, reduction: str = 'sum',
                      std: str = 'population') -> tf.Tensor:
  """KL(teacher ‖ student) between the two batches' kernel conditionals p(j|i), j != i.

  Args:
    teacher_repr: [m, ...] teacher representations (no gradient flows into them).
    student_repr: [m, ...] student representations of the same m examples.
    reduction: 'sum' (Σ over i and j != i) or 'mean' (that sum / m: mean over anchors i).
    std: 'population' (σ² over the m(m−1) distances) or 'sample' (over m(m−1) − 1).

  Returns:
    A float32 scalar; 0 for m <= 2.
  """
  _check(reduction, std)
  log_t = tf.stop_gradient(log_conditional_probabilities(tf.stop_gradient(teacher_repr), std))
  log_s = log_conditional_probabilities(student_repr, std)
  m = tf.shape(log_s)[0]
  off_diagonal = tf.logical_not(tf.eye(m, dtype=tf.bool))
  terms = tf.where(off_diagonal, tf.exp(log_t) * (log_t - log_s), tf.zeros_like(log_s))
  total = tf.reduce_sum(terms)
  if reduction == 'mean':
    total = tf.math.divide_no_nan(total, tf.cast(m, tf.float32))
  return total


# ------------------------------------------------------------------------------------------
# Client side: frozen teacher from the received weights, student tap, the extra-loss hook.
# ------------------------------------------------------------------------------------------


# The `tf.function` methods of TFF's Keras-backed VariableModel on the forward path.
_FORWARD_FUNCTIONS = ('forward_pass', 'predict_on_batch')


class RepresentationTap:
  """Records the input of the classifier layer every time a Keras-backed model runs.

  Installed on the student model built inside the client computation: after its training
  forward pass, `value` is that pass's representation r(x), so the KD term reuses it instead
  of running the body twice. For the tensor to be usable by the caller, the model's forward
  pass must be traced into the caller's graph: TFF 0.87 wraps `forward_pass` and
  `predict_on_batch` of its Keras model in `tf.function`s, whose inner tensors the training
  loop cannot read, so the tap rebinds those two methods on this model instance to their
  undecorated Python functions (same code, inlined into the loop's graph).
  """

  def __init__(self, model: tff.learning.models.VariableModel):
    keras_model = representation.keras_model_of(model)
    representation.representation_model(keras_model)  # validates a unique classifier input
    layer = representation.classifier_layer(keras_model)
    original_call = layer.call
    self.value = None

    def call(inputs, *args, **kwargs):
      self.value = inputs
      return original_call(inputs, *args, **kwargs)

    layer.call = call
    for name in _FORWARD_FUNCTIONS:
      method = getattr(type(model), name, None)
      python_function = getattr(method, 'python_function', None)
      if python_function is not None:
        setattr(model, name, python_function.__get__(model))


class KnowledgeDistillation(NamedTuple):
  """What `build_kd_loss` returns (use both in the same client computation)."""
  # teacher_representations(initial_weights, x) -> [n, ...]: the received model's
  # representations of all n examples (assigns initial_weights to the model first).
  teacher_representations: Callable[[Any, tf.Tensor], tf.Tensor]
  # extra_loss(batch, output, context) for `local_training.build_local_training`; context
  # must hold 'teacher_representations' and batch 'index' (the batch's rows in x).
  extra_loss: Callable[[Any, Any, Any], tf.Tensor]


def build_kd_loss(model: tff.learning.models.VariableModel, kd_weight: float,
                  reduction: str, batch_size: int,
                  std: str = 'population') -> KnowledgeDistillation:
  """CADIS's KD term for `model` (Keras-backed, with a 'classifier' layer).

  Call inside a `tff.tensorflow.computation`, with `model` the student that
  `build_local_training` trains. The teacher is the same model evaluated at the received
  weights before training starts (`teacher_representations`, which must run first: pass its
  result to training through `context`, which also orders the two calls). `reduction` and
  `std` as `kde_similarity_kl`.
  """
  _check(reduction, std)
  keras_model = representation.keras_model_of(model)
  rep_model = representation.representation_model(keras_model)
  rep_shape = rep_model.output_shape[1:]
  tap = RepresentationTap(model)
  chunk = int(batch_size)

  @tf.function
  def teacher_representations(initial_weights, x):
    weights = tff.learning.models.ModelWeights.from_model(model)
    tf.nest.map_structure(lambda v, t: v.assign(t), weights, initial_weights)
    n = tf.shape(x)[0]
    num_chunks = (n + chunk - 1) // chunk
    parts = tf.TensorArray(tf.float32, size=num_chunks, infer_shape=False,
                           element_shape=tf.TensorShape([None, *rep_shape]))
    for i in tf.range(num_chunks):
      rows = x[i * chunk:tf.minimum((i + 1) * chunk, n)]
      parts = parts.write(i, tf.cast(rep_model(rows, training=False), tf.float32))
    if num_chunks == 0:  # autograph: both branches are traced, the value picks one
      out = tf.zeros([0, *rep_shape], tf.float32)
    else:
      out = parts.concat()
    return out

  def extra_loss(batch, output, context):
    del output
    if tap.value is None:
      raise RuntimeError('the KD loss runs after the student forward pass')
    teacher = tf.gather(context['teacher_representations'], batch['index'])
    kl = kde_similarity_kl(teacher, tap.value, reduction, std)
    return tf.cast(kd_weight, kl.dtype) * kl

  return KnowledgeDistillation(teacher_representations, extra_loss)
