"""``GradSampler``: records what each trainable layer needs, then gives per-example gradients.

It sits above ``_grads`` (the per-example forms and the taps) and ``_device`` (the same forms
computed on an accelerator), and chooses between them per batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from dpcurator.errors import InternalError, UserError
from dpcurator.learn._device import OnDevice, device_per_example
from dpcurator.learn._grads import (
    _MIXING_LAYERS,
    _TAPS,
    Materialized,
    PerExample,
    Records,
    Workspace,
    _Layer,
    _layer_per_example,
    _tapped_class,
    _Use,
)

__all__ = ["GradSampler"]

# --- the sampler ----------------------------------------------------------------------------


class GradSampler:
    """Records what each trainable layer of ``module`` needs for per-example gradients.

    ``loss_reduction`` says how the loss combined the examples: "mean" (the gradients that
    reach the layers are divided by the batch size, which is undone) or "sum". ``fuse``
    treats a linear layer's weight and bias as one unit (fine for flat clipping, where only
    the total norm matters; per-layer clipping needs one unit per parameter).
    """

    def __init__(self, module: nn.Module, *, loss_reduction: str = "mean",
                 fuse: bool = True) -> None:
        if loss_reduction not in ("mean", "sum"):
            raise UserError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")
        self.loss_reduction = loss_reduction
        self.fuse = fuse
        #: Compute with torch operations where the tensors are (``_device``) rather than with
        #: the compiled CPU kernels; None: when the records are not on the CPU.
        self.on_device: bool | None = None
        self.module = module
        self.layers: list[_Layer] = []
        self._handles: list[Any] = []
        self._tapped: list[tuple[nn.Module, type[nn.Module]]] = []
        for name, sub in module.named_modules():  # check everything, then attach
            if isinstance(sub, _MIXING_LAYERS):
                raise UserError(
                    f"module {name or type(sub).__name__!r} ({type(sub).__name__}) mixes the "
                    "examples of a batch, so per-example gradients are not defined; use "
                    "nn.GroupNorm or nn.LayerNorm instead"
                )
            own = {n: p for n, p in sub.named_parameters(recurse=False) if p.requires_grad}
            if not own:
                continue
            if any(p.requires_grad for c in sub.children() for p in c.parameters()):
                raise UserError(
                    f"module {name!r} ({type(sub).__name__}) has trainable parameters of its "
                    "own and trainable submodules; per-example gradients need each trainable "
                    "parameter to belong to a module whose children are frozen or parameter-free"
                )
            self.layers.append(_Layer(name, sub, own))
        if not self.layers:
            raise UserError("module has no trainable parameters")
        for layer in self.layers:
            tapped = _tapped_class(layer.module)
            if tapped is not None:
                self._tapped.append((layer.module, type(layer.module)))
                layer.module.__class__ = tapped
                _TAPS[layer.module] = weakref.ref(layer)
            else:
                self._handles.append(layer.module.register_forward_hook(self._capture(layer)))

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trainable parameters, in the order ``per_example`` returns them."""
        for layer in self.layers:
            yield from layer.params.values()

    def _capture(self, layer: _Layer) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        held = weakref.ref(layer)  # as for tapped layers: nothing is recorded once it is gone

        def hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            if not torch.is_grad_enabled() or not isinstance(output, Tensor):
                return
            layer = held()
            if layer is None or not output.requires_grad:
                return
            if len(inputs) != 1 or not isinstance(inputs[0], Tensor):
                raise UserError(
                    f"layer {layer.name!r} ({type(module).__name__}) was called with "
                    f"{len(inputs)} inputs; per-example gradients need layers with trainable "
                    "parameters to take one tensor"
                )
            use = _Use(inputs[0].detach(), inputs[0]._version)
            layer.uses.append(use)
            output.register_hook(use.keep)  # type: ignore[no-untyped-call]

        return hook

    def clear(self) -> None:
        """Forget what was recorded (after a step, or on ``zero_grad``)."""
        for layer in self.layers:
            layer.uses.clear()

    def remove(self) -> None:
        """Detach from the module: hooks removed, tapped layers back to their own class."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module, cls in self._tapped:
            ref = _TAPS.get(module)
            if ref is not None and any(ref() is layer for layer in self.layers):
                del _TAPS[module]
            module.__class__ = cls
        self._tapped.clear()
        self.clear()

    def per_example(self, work: Workspace | None = None) -> tuple[int, list[PerExample]]:
        """The batch size and the per-example gradients of every trainable parameter, in the
        order of ``parameters()`` (scratch arrays from ``work``, valid until its next use)."""
        batch, records = self.records()
        return batch, self.parts(batch, records, work)

    def uses_device(self, records: Records) -> bool:
        """Whether these records are computed with torch operations (``_device``)."""
        if self.on_device is not None:
            return self.on_device
        return records[0][1][0].activation.device.type != "cpu"

    def records(self) -> tuple[int, Records]:
        """The batch size and each layer's calls recorded since the last step, checked (a
        gradient reached every layer, no input changed in place, one batch size)."""
        batch: int | None = None
        out: Records = []
        for layer in self.layers:
            done = [u for u in layer.uses if u.backprop is not None]
            if not done:
                raise UserError(
                    f"no gradient reached layer {layer.name!r} ({type(layer.module).__name__}) "
                    "since the last step: call loss.backward() before optimizer.step(), or "
                    "freeze the layer (requires_grad=False)"
                )
            for use in done:
                if use.activation._version != use.version:
                    raise UserError(
                        f"the input of layer {layer.name!r} was changed in place after the "
                        "layer used it; per-example gradients need it unchanged until "
                        "optimizer.step() (avoid in-place operations such as relu_ on it)"
                    )
                size = use.activation.shape[0] if use.activation.dim() else -1
                if batch is None:
                    batch = size
                if size != batch:
                    raise UserError(
                        f"layer {layer.name!r} saw a batch of {size} rows where the first "
                        f"layer saw {batch}: the batch must be the first dimension of every "
                        "trainable layer's input"
                    )
            out.append((layer, done))
        assert batch is not None
        return batch, out

    def parts(self, batch: int, records: Records, work: Workspace | None = None,
              scale: float | Tensor | None = None) -> list[PerExample]:
        """The per-example gradients of ``records``, in the order of ``parameters()``.
        ``scale`` (the loss reduction's batch size, or 1) may be given as a device scalar,
        which a replayed CUDA graph reads (``_device.ClippingGraphs``)."""
        if scale is None:
            scale = float(batch) if self.loss_reduction == "mean" and batch else 1.0
        on_device = self.uses_device(records)
        out: list[PerExample] = []
        for layer, done in records:
            if on_device:
                per_use: list[list[PerExample]] = [
                    list(device_per_example(layer, u, scale, self.fuse)) for u in done]
                whole: type[Materialized] | type[OnDevice] = OnDevice
            else:
                assert isinstance(scale, float)
                per_use = [_layer_per_example(layer, u, scale, self.fuse,
                                              work if len(done) == 1 else None) for u in done]
                whole = Materialized
            if len(per_use) == 1:
                out.extend(per_use[0])
            else:  # a layer called several times in one forward pass: gradients add up
                for param in layer.params.values():
                    total = sum(_gradient_of(parts, param) for parts in per_use)
                    assert isinstance(total, Tensor)
                    out.append(whole((param,), total))
        return out


def _gradient_of(parts: list[PerExample], param: nn.Parameter) -> Tensor:
    """One parameter's per-example gradients (B, *shape), in float64."""
    for part in parts:
        for p, grads in zip(part.params, part.gradients(), strict=True):
            if p is param:
                return grads
    raise InternalError("parameter missing from its layer's gradients; this is a bug")
