"""The plug-in client stages every client work accepts: FedLEx's guidance and CADIS's KD term.

Both change how a client trains, never what the server does with its upload
(docs/architecture.md, "Plug-ins"), so each is written once here. Every builder (public and
client work) takes them as one `ClientStages` value, `client_stages=`, and every client work
(`model_delta`, `model_upload`, `corrected_training`) takes its hooks into the shared
local-training loop from `ClientStages.hooks`. `ClientStages`' docstring documents the stages.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple, Optional

import numpy as np

from tff_algos import constants
from tff_algos.client_work import distillation


class TrainingHooks(NamedTuple):
  """What `build_local_training` and its `train` call take from the stages."""
  context: Any                 # OrderedDict for `train(..., context)`, or None
  gradient_transform: Any      # for `build_local_training(gradient_transform=)`, or None
  extra_loss: Any              # for `build_local_training(extra_loss=)`, or None


@dataclasses.dataclass(frozen=True)
class ClientStages:
  """The plug-in stages of one client work; the defaults are none at all.

  Attributes:
    guided: FedLEx's guidance (docs/algorithms.md#fedlex). G, in the client work's state
      (`state.client_work['guidance']`) and all ones after `initialize` (bit for bit the
      unguided method) until `tff_algos.fedlex.set_guidance` or `explore_and_initialize`
      installs one, multiplies every gradient of the local objective (proximal and KD terms
      included) before the optimizer step (FedSGD: its upload is G·g); a method's own
      gradient transform (SCAFFOLD's correction) comes after it.
    kd_weight: λ of CADIS's KD term (docs/algorithms.md#cadis): λ·KL(teacher ‖ student) of
      the representations' kernel similarities added to every batch loss
      (`distillation.build_kd_loss`), the teacher being the model the client received
      (FedCross: its middleware model). 0 (default) builds no teacher; > 0 needs a
      Keras-backed model with a 'classifier' layer and local steps, so FedSGD refuses it
      (its one gradient is taken where student and teacher coincide).
    kd_reduction: 'sum' (default, the reference code) or 'mean' (the sum / batch size) of
      the KD term over a batch's anchors (`distillation`).
    kd_std: σ of the KD kernel over a batch's pairwise distances: 'population' (default) or
      'sample' (n − 1, the reference code's `torch.std`; `distillation`).
  """
  guided: bool = False
  kd_weight: float = 0.0
  kd_reduction: str = 'sum'
  kd_std: str = 'population'

  def __post_init__(self):
    if not isinstance(self.guided, (bool, np.bool_)):
      raise TypeError(f'guided must be True or False, got {self.guided!r}')
    if isinstance(self.kd_weight, bool) or not isinstance(
        self.kd_weight, (int, float, np.integer, np.floating)) or not np.isfinite(
            self.kd_weight) or self.kd_weight < 0:
      raise ValueError(f'kd_weight must be a finite number >= 0, got {self.kd_weight!r}')
    if self.kd_reduction not in constants.KD_REDUCTIONS:
      raise ValueError(f'kd_reduction must be one of {constants.KD_REDUCTIONS}, got '
                       f'{self.kd_reduction!r}')
    if self.kd_std not in constants.KD_STDS:
      raise ValueError(f'kd_std must be one of {constants.KD_STDS}, got {self.kd_std!r}')
    object.__setattr__(self, 'guided', bool(self.guided))
    object.__setattr__(self, 'kd_weight', float(self.kd_weight))

  @staticmethod
  def of(client_stages) -> 'ClientStages':
    """`client_stages` if it is a `ClientStages`, else one TypeError naming the fix."""
    if not isinstance(client_stages, ClientStages):
      raise TypeError('client_stages must be a tff_algos.ClientStages, e.g. '
                      f'ClientStages(guided=True, kd_weight=0.5), got {client_stages!r}')
    return client_stages

  def check_local_steps(self, full_gradient: bool) -> None:
    """One ValueError when KD is asked of a client work without local steps (FedSGD)."""
    if self.kd_weight and full_gradient:
      raise ValueError(
          'kd_weight > 0 needs local training steps, which full_gradient (FedSGD) does not '
          'take: its one gradient is at the received model, where the student is the teacher '
          'and the KD term and its gradient are 0')

  def guidance_type(self, weights_type):
    """The guidance's type in the client work state (`model_delta.build_client_work_state`),
    or None when unguided."""
    return weights_type.trainable if self.guided else None

  def hooks(self, model, state, initial_weights, element, batch_size: int, *,
            context: Optional[dict] = None, gradient_transform=None) -> TrainingHooks:
    """The local-training hooks, inside the client's TF computation.

    Args:
      model: the student model the client trains (built in this computation).
      state: the client work state (holds `guidance` when guided).
      initial_weights: the weights the client received (KD's teacher).
      element: the client's whole-data structure (`local_training.single_element`).
      batch_size: the local batch size.
      context: the method's own entries of the loop's context (SCAFFOLD's correction).
      gradient_transform: the method's own transform, applied after the guidance.
    """
    context = collections.OrderedDict(context or {})
    transform = gradient_transform
    if self.guided:
      context['guidance'] = list(state['guidance'])
      transform = _after_guidance(gradient_transform)
    extra_loss = None
    if self.kd_weight:
      kd = distillation.build_kd_loss(model, self.kd_weight, self.kd_reduction, batch_size,
                                      self.kd_std)
      # Computed before training (training takes its result), at the received weights.
      context['teacher_representations'] = kd.teacher_representations(
          initial_weights, element['x'])
      extra_loss = kd.extra_loss
    return TrainingHooks(context or None, transform, extra_loss)


def _after_guidance(then):
  def transform(grads, context):
    guided = [g * m for g, m in zip(grads, context['guidance'])]
    return guided if then is None else then(guided, context)
  return transform
