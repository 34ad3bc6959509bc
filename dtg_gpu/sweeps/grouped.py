r"""Many runs of one sequential CNN as a single grouped network, for fast sweeps.

`m` runs of a model made of `Conv2d`, `ReLU`, `MaxPool2d`, `Flatten`, `Dropout` and
`Linear` layers (LeNet-5, VGG without batch norm), all fed the same mini-batch, are one
network: the first convolution stacks the `m` runs' filters along the output channels
(`[B, m·C, H, W]`), later convolutions are grouped convolutions with `groups = m` (times
the layer's own groups), and after `Flatten` the linear layers are batched matmuls
`[m, B, F] @ [m, F, G]`. Every run keeps its own weights, learning rate and dropout rate;
nothing mixes between runs, so a diverging run cannot spoil the others.

On 2 CPU cores this is about 2× faster per run than `torch.func.vmap` over per-run
mini-batches (one large convolution instead of `m` small ones) and, with channels-last
activations, `ReLU∘MaxPool` evaluated as `MaxPool` then `ReLU` (they commute, and so
do their gradients), faster still.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["GroupedSequential", "sequential_layers"]

_SUPPORTED = (nn.Conv2d, nn.ReLU, nn.MaxPool2d, nn.Flatten, nn.Dropout, nn.Linear)


def sequential_layers(model: nn.Module) -> list[nn.Module] | None:
    """The leaf modules of `model` in registration order, or `None` when any is not one
    of the supported layer types (the caller then verifies that they compose to `model`)."""
    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    if not leaves or any(not isinstance(m, _SUPPORTED) for m in leaves):
        return None
    if any(isinstance(m, nn.Conv2d) and (m.padding_mode != "zeros" or isinstance(m.padding, str)) for m in leaves):
        return None
    return leaves


class GroupedSequential:
    r"""`m` same-architecture sequential CNNs evaluated as one grouped network.

    Parameters
    ----------
    models : sequence of nn.Module
        Same class and shapes; their parameters are copied (stacked) at construction.
    dropout : sequence of float
        Per-run dropout rate used by every `Dropout` layer in training mode.
    example : Tensor
        A few inputs; the grouped forward is checked against the first two models on them.

    Attributes
    ----------
    params : dict[str, Tensor]
        `state_dict` names → stacked `[m, *shape]` leaf tensors (`requires_grad`).

    Raises
    ------
    ValueError
        The model is not a plain sequence of supported layers, or the grouped forward does
        not reproduce the per-run forward (checked numerically at construction).
    """

    def __init__(self, models: Sequence[nn.Module], dropout: Sequence[float], example: torch.Tensor):
        self.m = len(models)
        if len(dropout) != self.m:
            raise ValueError(f"{self.m} models but {len(dropout)} dropout rates")
        layers = sequential_layers(models[0])
        if layers is None:
            raise ValueError(
                f"{type(models[0]).__name__} is not a plain sequence of "
                "Conv2d/ReLU/MaxPool2d/Flatten/Dropout/Linear layers"
            )
        self.layers = layers
        names = {id(mod): name for name, mod in models[0].named_modules()}
        self.keys: list[tuple[str | None, str | None]] = []
        for mod in layers:
            if isinstance(mod, (nn.Conv2d, nn.Linear)):
                prefix = names[id(mod)]
                self.keys.append((f"{prefix}.weight", f"{prefix}.bias" if mod.bias is not None else None))
            else:
                self.keys.append((None, None))
        device = next(models[0].parameters()).device
        per_model = [dict(m.named_parameters()) for m in models]
        self.params = {k: torch.stack([ps[k].detach() for ps in per_model]).requires_grad_() for k in per_model[0]}
        used = {k for pair in self.keys for k in pair if k}
        if used != set(self.params):
            raise ValueError("model has parameters outside its Conv2d/Linear layers")
        seen_weights = False
        for mod in layers:
            seen_weights |= isinstance(mod, (nn.Conv2d, nn.Linear))
            if isinstance(mod, nn.Dropout) and not seen_weights:
                raise ValueError("Dropout before the first Conv2d/Linear is not supported grouped")
        self.keep = 1.0 - torch.as_tensor(list(dropout), dtype=torch.float32, device=device)
        self._check(models, example[:2])

    @torch.no_grad()
    def _check(self, models: Sequence[nn.Module], x: torch.Tensor) -> None:
        probe = models[0]
        was = [m.training for m in models]
        try:
            for m in models[:2]:
                m.eval()
            want = torch.stack([m(x) for m in models[:2]])
        except RuntimeError as exc:
            raise ValueError(f"cannot verify the grouped form of {type(probe).__name__}: {exc}") from exc
        finally:
            for m, w in zip(models, was):
                m.train(w)
        try:
            got = self.forward(x, train=False)[:2]
        except (RuntimeError, ValueError) as exc:
            raise ValueError(f"{type(probe).__name__} cannot be trained grouped: {exc}") from exc
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-5):
            raise ValueError(
                f"{type(probe).__name__}: forward is not the plain composition of its layers; cannot train it grouped"
            )

    def forward(self, x: torch.Tensor, train: bool = True) -> torch.Tensor:
        r"""Logits `[m, B, classes]` of every run on the shared batch `x`."""
        m, p = self.m, self.params
        h = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
        flat = x.dim() == 2  # [m, B, F] once flattened
        if flat:
            h = h.unsqueeze(0).expand(m, *h.shape)
        shared = True  # the input is not yet per-run
        i, n = 0, len(self.layers)
        while i < n:
            mod, (wk, bk) = self.layers[i], self.keys[i]
            if isinstance(mod, nn.Conv2d):
                assert wk is not None
                w = p[wk]
                b = p[bk].reshape(-1) if bk else None
                if shared and mod.groups > 1:  # keep channels run-major: give each run a copy
                    h, shared = h.repeat(1, m, 1, 1), False
                groups = mod.groups if shared else mod.groups * m
                h = F.conv2d(h, w.reshape(-1, *w.shape[2:]), b, mod.stride, mod.padding, mod.dilation, groups)
                shared = False
            elif isinstance(mod, nn.ReLU):
                nxt = self.layers[i + 1] if i + 1 < n else None
                if isinstance(nxt, nn.MaxPool2d):  # relu∘pool = pool∘relu, on 4× fewer values
                    h = F.relu(self._pool(nxt, h))
                    i += 1
                else:
                    h = F.relu(h)
            elif isinstance(mod, nn.MaxPool2d):
                h = self._pool(mod, h)
            elif isinstance(mod, nn.Flatten):
                if not flat:
                    B = h.shape[0]
                    h = (
                        h.reshape(B, -1).unsqueeze(0).expand(m, B, -1)
                        if shared
                        else h.reshape(B, m, -1).transpose(0, 1)
                    )
                    flat, shared = True, False
            elif isinstance(mod, nn.Dropout):
                if train:  # keep-probability per run: [m, 1, 1] flat, [1, m·C, 1, 1] as maps
                    keep = self.keep.to(h.dtype)
                    k = (
                        keep.view(-1, *([1] * (h.dim() - 1)))
                        if flat
                        else keep.repeat_interleave(h.shape[1] // m).view(1, -1, 1, 1)
                    )
                    h = h * (torch.rand_like(h) < k) / k.clamp_min(1e-12)
            elif isinstance(mod, nn.Linear):
                assert wk is not None
                w = p[wk]
                if not flat:
                    raise ValueError("Linear before Flatten is not supported grouped")
                h = (
                    torch.bmm(h, w.transpose(1, 2))
                    if not bk
                    else torch.baddbmm(p[bk].unsqueeze(1), h, w.transpose(1, 2))
                )
                shared = False
            i += 1
        return h

    @staticmethod
    def _pool(mod: nn.MaxPool2d, h: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(h, mod.kernel_size, mod.stride, mod.padding, mod.dilation, mod.ceil_mode)

    def state(self, j: int) -> dict[str, torch.Tensor]:
        """Run `j`'s parameters as a `state_dict` (detached views)."""
        return {k: v.detach()[j] for k, v in self.params.items()}
