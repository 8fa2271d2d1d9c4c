"""The PyTorch side of `client_training_vs_pytorch.py`: the zoo models' PyTorch twins and a
PyTorch simulator's round, served to that benchmark from a child process.

Runs only in an interpreter with PyTorch (`pip install '.[bench]'`); imports nothing of the
project, so it runs from any interpreter: `python benchmarks/torch_twins.py` reads pickled
requests `(kind, arguments)` on stdin and answers each on stdout with `(True, reply)` or
`(False, traceback)`. Replies hold Python numbers only (the two interpreters' NumPy versions
need not read each other's pickles; a NumPy 1.x pickle is read by NumPy 2).

Twins: the same layers, shapes, activations and parameter counts as `tff_algos.models.zoo`,
in PyTorch's layout (NCHW inputs; Conv2d weights [out, in, kh, kw]; Linear [out, in]).
Keras' 'same' padding with stride 2 pads the extra row and column after, where PyTorch's
`padding=1` pads both sides: those convolutions pad explicitly (`TFSameConv2d`); stride-1
odd-kernel 'same' convolutions are plain `nn.Conv2d(padding=k // 2)`. A Dense layer fed by a
Flatten reads Keras' (h, w, c) feature order: its weights are permuted to PyTorch's (c, h, w)
when loaded. BatchNorm as Keras': epsilon 1e-3, moving averages at momentum 0.99 (PyTorch's
momentum 0.01).

A round: each client loads the global weights, trains its local epochs of plain SGD (mean
cross-entropy over a batch) over batches indexed from tensors converted once at set-up (no
DataLoader: a tight loop), then the global state is the example-weighted mean of the clients'
state dicts (parameters and BatchNorm statistics), as PFLlib's and Flower's simulations do.
"""

import pickle
import sys
import time
import traceback

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

TWINS = ('fedavg_cnn', 'simple_cnn', 'mlp_2nn', 'resnet20')
BN_EPSILON = 1e-3   # Keras BatchNormalization's epsilon
BN_MOMENTUM = 0.01  # PyTorch's weight of the new batch: Keras' momentum 0.99


class TFSameConv2d(nn.Conv2d):
  """`nn.Conv2d` with TF's 'same' padding: the odd extra row/column padded after."""

  def forward(self, x):
    pads = []
    for axis, dim in ((3, 1), (2, 0)):   # F.pad takes the last axis first
      size, k, s = x.shape[axis], self.kernel_size[dim], self.stride[dim]
      total = max((-(-size // s) - 1) * s + k - size, 0)
      pads += [total // 2, total - total // 2]
    return super().forward(F.pad(x, pads))


def _conv(cin, cout, k, stride=1, padding='same', bias=True):
  if padding == 'valid':
    return nn.Conv2d(cin, cout, k, stride, 0, bias=bias)
  if stride == 1 and k % 2:   # symmetric: PyTorch's own padding
    return nn.Conv2d(cin, cout, k, 1, k // 2, bias=bias)
  return TFSameConv2d(cin, cout, k, stride, 0, bias=bias)


def _bn(channels):
  return nn.BatchNorm2d(channels, eps=BN_EPSILON, momentum=BN_MOMENTUM)


class TwoConvCNN(nn.Module):
  """zoo's fedavg_cnn ('same') and simple_cnn ('valid')."""

  def __init__(self, input_shape, num_classes, padding):
    super().__init__()
    h, w, c = input_shape
    self.conv1 = _conv(c, 32, 5, padding=padding)
    self.conv2 = _conv(32, 64, 5, padding=padding)
    shrink = 0 if padding == 'same' else 4
    h, w = (h - shrink) // 2, (w - shrink) // 2
    h, w = (h - shrink) // 2, (w - shrink) // 2
    self.fc1 = nn.Linear(64 * h * w, 512)
    self.classifier = nn.Linear(512, num_classes)
    self.flattened = {'fc1': (64, h, w)}   # Dense layers fed by a Flatten: its (c, h, w)

  def keras_layers(self):
    return dict(conv1=self.conv1, conv2=self.conv2, fc1=self.fc1, classifier=self.classifier)

  def forward(self, x):
    x = F.max_pool2d(F.relu(self.conv1(x)), 2)
    x = F.max_pool2d(F.relu(self.conv2(x)), 2)
    x = F.relu(self.fc1(torch.flatten(x, 1)))
    return self.classifier(x)


class MLP2NN(nn.Module):
  """zoo's mlp_2nn: Flatten, two 200-unit ReLU layers, classifier."""

  def __init__(self, input_shape, num_classes, hidden=200):
    super().__init__()
    h, w, c = input_shape
    self.fc1 = nn.Linear(h * w * c, hidden)
    self.fc2 = nn.Linear(hidden, hidden)
    self.classifier = nn.Linear(hidden, num_classes)
    self.flattened = {'fc1': (c, h, w)}

  def keras_layers(self):
    return dict(fc1=self.fc1, fc2=self.fc2, classifier=self.classifier)

  def forward(self, x):
    x = F.relu(self.fc1(torch.flatten(x, 1)))
    return self.classifier(F.relu(self.fc2(x)))


class BasicBlock(nn.Module):
  """ResNet-20's block: conv-BN-ReLU, conv-BN, plus the option-A shortcut, ReLU."""

  def __init__(self, cin, cout, stride):
    super().__init__()
    self.a_conv = _conv(cin, cout, 3, stride, bias=False)
    self.a_bn = _bn(cout)
    self.b_conv = _conv(cout, cout, 3, 1, bias=False)
    self.b_bn = _bn(cout)
    self.stride, self.extra = stride, cout - cin

  def forward(self, x):
    r = self.b_bn(self.b_conv(F.relu(self.a_bn(self.a_conv(x)))))
    s = x
    if self.stride != 1 or self.extra:   # zoo's ShortcutA: subsample, zero-pad channels
      s = x[:, :, ::self.stride, ::self.stride]
      s = F.pad(s, (0, 0, 0, 0, self.extra // 2, self.extra - self.extra // 2))
    return F.relu(r + s)


class ResNet20(nn.Module):
  """zoo's resnet20 with shortcut 'A'."""

  def __init__(self, input_shape, num_classes):
    super().__init__()
    c = input_shape[2]
    self.stem_conv = _conv(c, 16, 3, bias=False)
    self.stem_bn = _bn(16)
    blocks, names, cin = [], [], 16
    for stage, filters in enumerate((16, 32, 64), start=1):
      for block in range(3):
        blocks.append(BasicBlock(cin, filters, 2 if stage > 1 and block == 0 else 1))
        names.append(f'stage{stage}_block{block}')
        cin = filters
    self.blocks = nn.ModuleList(blocks)
    self.block_names = names
    self.classifier = nn.Linear(64, num_classes)
    self.flattened = {}

  def keras_layers(self):
    layers = dict(stem_conv=self.stem_conv, stem_bn=self.stem_bn)
    for name, block in zip(self.block_names, self.blocks):
      for part in ('a_conv', 'a_bn', 'b_conv', 'b_bn'):
        layers[f'{name}_{part}'] = getattr(block, part)
    layers['classifier'] = self.classifier
    return layers

  def forward(self, x):
    x = F.relu(self.stem_bn(self.stem_conv(x)))
    for block in self.blocks:
      x = block(x)
    return self.classifier(x.mean(dim=(2, 3)))


def build_twin(name, input_shape, num_classes):
  if name in ('fedavg_cnn', 'simple_cnn'):
    return TwoConvCNN(input_shape, num_classes, 'same' if name == 'fedavg_cnn' else 'valid')
  if name == 'mlp_2nn':
    return MLP2NN(input_shape, num_classes)
  if name == 'resnet20':
    return ResNet20(input_shape, num_classes)
  raise ValueError(f'no PyTorch twin of {name!r}; twins: {", ".join(TWINS)}')


def torch_layout(twin, layers) -> dict:
  """Keras layers' weights [(layer name, layer.get_weights())] as the twin's state-dict
  entries {name: tensor}; every twin layer must be given, with its shapes."""
  modules = twin.keras_layers()
  if sorted(modules) != sorted(name for name, _ in layers):
    raise ValueError(f'Keras layers {sorted(n for n, _ in layers)} are not the twin\'s '
                     f'{sorted(modules)}')
  prefix = {module: name for name, module in twin.named_modules()}
  entries = {}
  for name, weights in layers:
    module = modules[name]
    if isinstance(module, nn.Conv2d):   # [kh, kw, in, out] -> [out, in, kh, kw]
      values = [np.transpose(weights[0], (3, 2, 0, 1))] + list(weights[1:])
      fields = ('weight', 'bias')
    elif isinstance(module, nn.Linear):
      kernel = weights[0]
      if name in twin.flattened:   # rows in Keras' (h, w, c) order -> columns in (c, h, w)
        c, h, w = twin.flattened[name]
        kernel = kernel.reshape(h, w, c, -1).transpose(3, 2, 0, 1).reshape(kernel.shape[1], -1)
      else:
        kernel = kernel.T
      values, fields = [kernel] + list(weights[1:]), ('weight', 'bias')
    else:   # BatchNorm: gamma, beta, moving mean, moving variance
      values, fields = weights, ('weight', 'bias', 'running_mean', 'running_var')
    for field, value in zip(fields, values):
      key = f'{prefix[module]}.{field}'
      target = getattr(module, field)
      if tuple(target.shape) != value.shape:
        raise ValueError(f'{name} {field}: Keras {value.shape}, PyTorch {tuple(target.shape)}')
      entries[key] = torch.from_numpy(np.ascontiguousarray(value, np.float32))
  return entries


class Simulator:
  """A PyTorch simulator's clients and global model (one model x batch setting)."""

  def __init__(self, model, input_shape, num_classes, layers, xs, ys, lr, batch):
    self.model = build_twin(model, tuple(input_shape), num_classes)
    self.model.load_state_dict(torch_layout(self.model, layers), strict=False)
    self.global_state = {k: v.clone() for k, v in self.model.state_dict().items()}
    # Clients' data converted once, as a simulator's datasets are: NHWC -> NCHW.
    self.xs = [torch.from_numpy(np.ascontiguousarray(
        x.transpose(0, 3, 1, 2) if x.ndim == 4 else x, np.float32)) for x in xs]
    self.ys = [torch.from_numpy(y.astype(np.int64)) for y in ys]
    self.lr, self.batch = lr, batch

  def counts(self) -> dict:
    return dict(
        trainable=sum(p.numel() for p in self.model.parameters()),
        non_trainable=sum(b.numel() for n, b in self.model.named_buffers()
                          if not n.endswith('num_batches_tracked')))

  def train_client(self, client, order):
    """The client's local epochs from the global state, one row of `order` per epoch."""
    model, x, y = self.model, self.xs[client], self.ys[client]
    model.load_state_dict(self.global_state)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=self.lr)
    for step in torch.from_numpy(np.asarray(order, np.int64).reshape(-1, self.batch)):
      optimizer.zero_grad()
      F.cross_entropy(model(x[step]), y[step]).backward()
      optimizer.step()

  def round(self, orders) -> float:
    """One round (every client, in turn); its seconds."""
    t0 = time.perf_counter()
    total, acc = 0, None
    with torch.no_grad():
      for client, order in enumerate(orders):
        with torch.enable_grad():
          self.train_client(client, order)
        n = self.xs[client].shape[0]
        state = self.model.state_dict()
        if acc is None:
          acc = {k: v.float() * n for k, v in state.items() if v.is_floating_point()}
        else:
          for k in acc:
            acc[k].add_(state[k], alpha=n)
        total += n
      for k, v in acc.items():
        self.global_state[k] = v / total
    return time.perf_counter() - t0

  def epoch_difference(self, client, order, layers_after) -> float:
    """Max |twin - Keras| over the trainable weights after the client's epoch (`order`)
    from the global state, Keras' given as its layers' weights after the same epoch."""
    self.train_client(client, order)
    expected = torch_layout(self.model, layers_after)
    return max(float((p.detach() - expected[k]).abs().max())
               for k, p in self.model.named_parameters())


def serve(requests, replies):
  """Answers requests until stdin closes: hello, setup, round, epoch_difference."""
  simulator = None
  while True:
    try:
      kind, args = pickle.load(requests)
    except EOFError:
      return
    try:
      if kind == 'hello':
        if args['threads']:
          torch.set_num_threads(args['threads'])
        reply = dict(torch=str(torch.__version__), threads=torch.get_num_threads(),
                     interop_threads=torch.get_num_interop_threads())
      elif kind == 'setup':
        simulator = Simulator(**args)
        reply = simulator.counts()
      elif kind == 'round':
        reply = simulator.round(args['orders'])
      elif kind == 'epoch_difference':
        reply = simulator.epoch_difference(**args)
      else:
        raise ValueError(f'unknown request {kind!r}')
      answer = (True, reply)
    except Exception:  # pylint: disable=broad-except
      answer = (False, traceback.format_exc())
    pickle.dump(answer, replies, protocol=4)
    replies.flush()


if __name__ == '__main__':
  serve(sys.stdin.buffer, sys.stdout.buffer)
