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
from torch.nn.utils import parametrize

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
            _check_module(name, sub)
            own = {n: p for n, p in sub.named_parameters(recurse=False) if p.requires_grad}
            if not own:
                continue
            if _tapped_class(sub) is not None and not set(own) <= {"weight", "bias"}:
                raise UserError(
                    f"module {name!r} ({type(sub).__name__}) has the parameters "
                    f"{', '.join(sorted(own))}: a reparametrized weight (weight or spectral "
                    "normalization) is not supported; per-example gradients need the layer's "
                    "own weight and bias"
                )
            if any(p.requires_grad for c in sub.children() for p in c.parameters()):
                raise UserError(
                    f"module {name!r} ({type(sub).__name__}) has trainable parameters of its "
                    "own and trainable submodules; per-example gradients need each trainable "
                    "parameter to belong to a module whose children are frozen or parameter-free"
                )
            self.layers.append(_Layer(name, sub, own))
        if not self.layers:
            raise UserError("module has no trainable parameters")
        #: The data loader's current chunk (``_sampling.Chunk``), recorded with each call of
        #: a layer; None (the default) records none and checks none.
        self.chunk_of: Callable[[], Any] | None = None
        #: The chunk of the records last returned by ``records`` (None: not known)
        self.chunk: Any = None
        self._buffers = _buffer_state(module)
        # The module's forward passes with gradients, counted: each call of a layer records
        # the pass it belongs to, so a step can refuse records of two passes (two batches
        # read before one step). A list, so that the hook holds no reference to self.
        self._passes = [0]
        passes = self._passes

        def count(module: nn.Module, args: Any) -> None:
            if torch.is_grad_enabled():
                passes[0] += 1

        self._handles.append(module.register_forward_pre_hook(count))
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
            use = _Use(inputs[0].detach(), inputs[0]._version,  # (no reference to self)
                       chunk=layer.chunk_of() if layer.chunk_of is not None else None)
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

    def watch(self, chunk_of: Callable[[], Any] | None) -> None:
        """Record the data loader's current chunk with every call of a trainable layer, so
        that ``records`` can check a step against the chunk it read (None: stop; a benchmark
        timing steps on one fixed batch does, a training run never should)."""
        self.chunk_of = chunk_of
        passes = self._passes

        def current() -> tuple[Any, int]:  # the chunk, and the forward pass
            assert chunk_of is not None
            return chunk_of(), passes[0]

        for layer in self.layers:
            layer.chunk_of = current if chunk_of is not None else None

    def records(self) -> tuple[int, Records]:
        """The batch size and each layer's calls recorded since the last step, checked (a
        gradient reached every layer, no input changed in place, one batch size, one chunk
        of the data loader with one row per example, no buffer changed); ``chunk`` is then
        that chunk (None where none was recorded)."""
        self._check_buffers()
        batch: int | None = None
        chunks: set[Any] = set()
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
                chunks.add(use.chunk)
                size = use.activation.shape[0] if use.activation.dim() else -1
                if batch is None:
                    batch = size
                if size != batch:
                    _one_chunk(chunks, size)  # two batches' records: say so first
                    raise UserError(
                        f"layer {layer.name!r} saw a batch of {size} rows where the first "
                        f"layer saw {batch}: the batch must be the first dimension of every "
                        "trainable layer's input"
                    )
            out.append((layer, done))
        assert batch is not None
        self.chunk = _one_chunk(chunks, batch)
        return batch, out

    def _check_buffers(self) -> None:
        """Refuse a step once a buffer of the module has changed since it was made private:
        a buffer written in training (running statistics, say) is computed from the examples
        without clipping or noise, and the model holds it (a bug hunt: InstanceNorm's running
        mean published one example scaled by 1e6)."""
        now = dict(self.module.named_buffers())
        for name, (buffer, version, values) in self._buffers.items():
            current = now.get(name)
            same = current is buffer and current._version == version
            if not same and (current is None or current.shape != values.shape or
                             not torch.equal(current.detach().cpu(), values)):
                raise UserError(
                    f"the module's buffer {name!r} changed during training: it is computed "
                    "from the training examples without clipping or noise, so the model is "
                    "not private (do not publish it); freeze what writes it, or remove it")
            if current is not buffer and current is not None:  # moved (module.to): same values
                self._buffers[name] = (current, current._version, values)

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


def _check_module(name: str, sub: nn.Module) -> None:
    """Refuse the modules whose per-example gradients are undefined or whose state is
    written from the data without noise."""
    label = f"module {name or type(sub).__name__!r} ({type(sub).__name__})"
    if isinstance(sub, _MIXING_LAYERS):
        raise UserError(f"{label} mixes the examples of a batch, so per-example gradients "
                        "are not defined; use nn.GroupNorm or nn.LayerNorm instead")
    if isinstance(sub, nn.modules.instancenorm._InstanceNorm) and sub.track_running_stats:
        raise UserError(f"{label} tracks running statistics of the training examples, "
                        "which it keeps without noise; set track_running_stats=False")
    if isinstance(sub, nn.RNNBase):
        raise UserError(f"{label}: recurrent layers (RNN, LSTM, GRU) are not supported; "
                        "per-example gradients are computed for layers that take one tensor")
    if parametrize.is_parametrized(sub):
        raise UserError(f"{label} has a parametrized weight (torch.nn.utils.parametrize, "
                        "weight or spectral normalization), which is not supported")


def _buffer_state(module: nn.Module) -> dict[str, tuple[Tensor, int, Tensor]]:
    """Each buffer, its version counter and a copy of its values (``_check_buffers``)."""
    return {name: (buffer, buffer._version, buffer.detach().cpu().clone())
            for name, buffer in module.named_buffers()}


def _one_chunk(chunks: set[Any], batch: int) -> Any:
    """The one data loader's chunk the step's records come from (None where none was
    recorded), checked against the batch the layers saw. ``chunks`` holds, per recorded call
    with a gradient, the loader's chunk and the module's forward pass then (or None)."""
    if len(chunks) > 1:
        raise UserError(
            "the gradients recorded since the last step come from several forward passes or "
            "several batches of the data loader; call optimizer.step() after each batch's "
            "forward pass and backward() (for batches larger than memory allows, give "
            "make_private max_physical_batch_size; run evaluation under torch.no_grad()): "
            "gradients of two passes are paired row by row, not clipped per example")
    (entry,) = chunks
    chunk = entry[0] if entry is not None else None
    if chunk is not None and chunk.size != batch:
        raise UserError(
            f"the trainable layers saw a batch of {batch} rows where the data loader gave "
            f"{chunk.size} examples: the first dimension of every trainable layer's input must "
            "be the examples, one row each (a layer that sees (sequence, batch, features) "
            "needs its input transposed to batch first), or one example is clipped as several")
    return chunk


def _gradient_of(parts: list[PerExample], param: nn.Parameter) -> Tensor:
    """One parameter's per-example gradients (B, *shape), in float64."""
    for part in parts:
        for p, grads in zip(part.params, part.gradients(), strict=True):
            if p is param:
                return grads
    raise InternalError("parameter missing from its layer's gradients; this is a bug")
