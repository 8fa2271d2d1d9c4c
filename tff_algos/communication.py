"""Bytes on the wire: what one client downloads and uploads per call of a federated
computation, read from the TFF types of the intrinsics that move values between the server
and the clients (docs/methods.md, "What crosses the wire").

`process_traffic(process)` walks `process.next`'s building block: a download is an intrinsic
taking a value @SERVER and giving one @CLIENTS (`federated_broadcast`, `federated_select`:
one value per key), an upload one taking values @CLIENTS and giving one @SERVER
(`federated_sum`, `federated_mean`, `federated_aggregate`, ...: each @CLIENTS operand). Each
crossing splits into payload (model-shaped values and the per-client values a server rule
reads, `RULE_FIELDS`) and overhead (everything else: metrics, aggregation weights, client
index and slot, optimizer hyperparameters). A `federated_select`'s keys are not counted: the
server assigned them (the round's slot or the sampled client's index). The building blocks
are TFF 0.87's (`tensorflow_federated.python.core.impl.compiler`), which has no public walk.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import tensorflow_federated as tff
from tensorflow_federated.python.core.impl.compiler import building_blocks

# Scalar fields of an upload a server rule reads: FedCDA's selection weighs each cached
# model by its client's last-epoch loss (client_work/model_upload.py's upload).
RULE_FIELDS = ('last_epoch_loss',)


def type_bytes(type_spec: tff.Type) -> int:
  """Bytes of one value of `type_spec` as tensors (dtype size x elements), summed over a
  struct; a federated type counts its member once. Raises ValueError on a shape or dtype
  without a fixed size (unknown dimensions, strings, sequences)."""
  if isinstance(type_spec, tff.FederatedType):
    return type_bytes(type_spec.member)
  if isinstance(type_spec, tff.StructType):
    return sum(type_bytes(t) for t in type_spec)
  if isinstance(type_spec, tff.TensorType):
    dtype = np.dtype(type_spec.dtype)
    if dtype.kind in 'OSU' or type_spec.shape is None or None in type_spec.shape:
      raise ValueError(f'{type_spec} has no fixed size in bytes')
    return dtype.itemsize * math.prod(type_spec.shape)
  raise ValueError(f'{type_spec} has no fixed size in bytes')


def _leaf_shapes(type_spec: tff.Type) -> list:
  if isinstance(type_spec, tff.StructType):
    return [s for t in type_spec for s in _leaf_shapes(t)]
  return [getattr(type_spec, 'shape', None)]


@dataclasses.dataclass(frozen=True)
class Crossing:
  """One intrinsic's value, as one client sends or receives it."""
  direction: str          # 'down' or 'up'
  intrinsic: str          # the intrinsic's URI, e.g. 'federated_broadcast'
  type_spec: tff.Type     # the value one client receives or sends (unplaced)
  count: int              # values per client (the keys of a federated_select; else 1)
  payload: int            # bytes per client
  overhead: int           # bytes per client


@dataclasses.dataclass(frozen=True)
class ClientTraffic:
  """Bytes one client receives (down) and sends (up) per call, split payload / overhead,
  with the crossings they sum."""
  down_payload: int
  down_overhead: int
  up_payload: int
  up_overhead: int
  crossings: tuple

  def round_bytes(self, sampled: int, reported: Optional[int] = None) -> dict:
    """A round's bytes: every one of `sampled` clients downloads, the `reported` ones
    (default: all sampled) upload."""
    reported = sampled if reported is None else reported
    return dict(bytes_down_payload=sampled * self.down_payload,
                bytes_down_overhead=sampled * self.down_overhead,
                bytes_up_payload=reported * self.up_payload,
                bytes_up_overhead=reported * self.up_overhead)


def _split(type_spec: tff.Type, model_shapes: list) -> tuple[int, int]:
  """(payload, overhead) bytes of one value: a (sub)struct with the model's tensor shapes
  (its weights or its trainable weights, any dtype) and a `RULE_FIELDS` field are payload."""
  if isinstance(type_spec, tff.StructType):
    if _leaf_shapes(type_spec) in model_shapes:
      return type_bytes(type_spec), 0
    payload = overhead = 0
    for name, member in tff.structure.iter_elements(type_spec):
      if name in RULE_FIELDS:
        payload += type_bytes(member)
      else:
        p, o = _split(member, model_shapes)
        payload, overhead = payload + p, overhead + o
    return payload, overhead
  return 0, type_bytes(type_spec)


def _placed_at(type_spec: tff.Type, placement) -> list:
  """The top-level operands of an intrinsic's parameter placed at `placement`."""
  operands = list(type_spec) if isinstance(type_spec, tff.StructType) else [type_spec]
  return [t for t in operands
          if isinstance(t, tff.FederatedType) and t.placement is placement]


def _intrinsic_crossings(intrinsic: building_blocks.Intrinsic) -> list:
  """(direction, per-client type, count) of each value one call of `intrinsic` moves."""
  signature = intrinsic.type_signature
  parameter, result = signature.parameter, signature.result
  if parameter is None or not isinstance(result, tff.FederatedType):
    return []
  if result.placement is tff.CLIENTS and _placed_at(parameter, tff.SERVER):
    member = result.member
    if isinstance(member, tff.SequenceType):   # federated_select: one value per key
      keys = _placed_at(parameter, tff.CLIENTS)[0].member
      if keys.shape is None or None in keys.shape:
        raise ValueError(f'{intrinsic.uri}: the clients\' keys {keys} have no fixed count')
      return [('down', member.element, math.prod(keys.shape))]
    return [('down', member, 1)]
  if result.placement is tff.SERVER:
    return [('up', t.member, 1) for t in _placed_at(parameter, tff.CLIENTS)]
  return []


def crossings(computation: tff.Computation, model_weights_type: tff.Type) -> list:
  """Every value `computation` moves between the server and one client, as `Crossing`s
  (payload: values shaped like `model_weights_type` or its `trainable` part)."""
  model_shapes = [_leaf_shapes(model_weights_type),
                  _leaf_shapes(model_weights_type.trainable)]
  found = []

  def visit(comp):
    if isinstance(comp, building_blocks.Call) and isinstance(
        comp.function, building_blocks.Intrinsic):
      for direction, type_spec, count in _intrinsic_crossings(comp.function):
        payload, overhead = _split(type_spec, model_shapes)
        found.append(Crossing(direction, comp.function.uri, type_spec, count,
                              count * payload, count * overhead))
    for child in comp.children():
      visit(child)

  visit(computation.to_building_block())
  return found


def computation_traffic(computation: tff.Computation, model_weights_type: tff.Type
                        ) -> ClientTraffic:
  """Per-client bytes of one call of a federated computation (e.g. FedLEx's exploration,
  whose model weights type is its first parameter's member)."""
  found = tuple(crossings(computation, model_weights_type))

  def total(direction, part):
    return sum(getattr(x, part) for x in found if x.direction == direction)

  return ClientTraffic(total('down', 'payload'), total('down', 'overhead'),
                       total('up', 'payload'), total('up', 'overhead'), found)


def process_traffic(process: tff.templates.IterativeProcess) -> ClientTraffic:
  """Per-client bytes of one round of a `LearningProcess` (its `next`)."""
  return computation_traffic(process.next, process.get_model_weights.type_signature.result)


def describe(traffic: ClientTraffic) -> list:
  """The crossings as JSON-ready rows: direction, intrinsic, type, count, payload, overhead."""
  return [dict(direction=x.direction, intrinsic=x.intrinsic,
               type=x.type_spec.compact_representation(), count=x.count,
               payload=x.payload, overhead=x.overhead) for x in traffic.crossings]

