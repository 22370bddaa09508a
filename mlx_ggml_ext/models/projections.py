"""One product for the projections of a layer that read the same x: q/k/v, and gate/up.

At decode a token's products are small and many (7 a layer), and each costs a fixed amount of host work however
small it is (graph building, MLX's per-node cost, a kernel launch on a GPU: docs/performance.md). Projections
that read the same x and whose weights share a block type are one matrix as far as ggml's layout goes (rows are
independent, so their blocks stack), so their weights are stacked once at load and computed in one product:

- attention: the members of q_proj/k_proj/v_proj of one block type (all three in a Q4_0 or Q8_0 file; q and k
  in a Q4_K_M file, whose v is Q6_K) become one `GGMLLinear` stored as `fused_proj`; mlx-lm's attention still
  calls q_proj(x), k_proj(x), v_proj(x), which are `ProjectionSlice`s: the first call computes the stacked
  product, each returns its columns.
- the feed-forward: gate and up of one type become `GatedMLP`'s `gate_up_proj`, ggml's fused layout, which
  `ops.glu` takes as it is (models/fused.py).

Each output element is the same dot product of the same row as before, so the results are unchanged. The
stacked weights are a copy (the file's mapping keeps the originals, as page cache). mlx-lm's LoRA conversion
takes a slice out of its stack (`ProjectionSlice.to_lora`).
"""

from __future__ import annotations

from typing import List, Optional

import mlx.core as mx
import mlx.nn as nn

from ..nn import GGMLLinear
from ..types import GGMLTensor


def stack_linears(layers: List[GGMLLinear]) -> GGMLLinear:
    """One GGMLLinear whose rows are those of `layers` in order (same block type, input size and precise_x;
    biases on all or none)."""
    first = layers[0]
    weight = mx.concatenate([layer["weight"] for layer in layers], axis=0)
    biases = [layer.get("bias") for layer in layers]
    bias = None if biases[0] is None else mx.concatenate(biases)
    mx.eval(weight, *([] if bias is None else [bias]))
    rows = sum(layer.output_dims for layer in layers)
    stacked = GGMLTensor(weight, first.ggml_type, (rows, first.input_dims))
    return GGMLLinear(stacked, bias, precise_x=first.precise_x)


def stackable(layers: List[nn.Module]) -> bool:
    """Whether the layers are GGMLLinears that one stacked product can replace."""
    if len(layers) < 2 or not all(type(layer) is GGMLLinear for layer in layers):
        return False
    first = layers[0]
    return all(layer.ggml_type == first.ggml_type and layer.input_dims == first.input_dims
               and layer.precise_x == first.precise_x and ("bias" in layer) == ("bias" in first)
               for layer in layers)


class _StackedProduct:
    """The stacked product of one x, shared by the ProjectionSlices of a layer (not a module: the stacked
    GGMLLinear is registered once, in the attention module)."""

    def __init__(self, owner: nn.Module, name: str, sizes: List[int]):
        self._owner, self._name = owner, name
        self.starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.consumers = len(sizes)  # the slices that still read the product (to_lora takes one out)
        self.x: Optional[mx.array] = None
        self.parts: Optional[list] = None
        self.pending = 0

    @property
    def linear(self) -> nn.Module:
        # Looked up in the owning module at every use, not kept: a product module replaced after load (MLX's
        # nn.quantize, update_modules) is the one the slices read (a kept reference went on reading the old one).
        return self._owner[self._name]

    def part(self, index: int, x: mx.array) -> mx.array:
        # mlx-lm calls q_proj(x), k_proj(x), v_proj(x) with the same array object: the first call computes the
        # product, the last one lets go of it (so that no array outlives the forward pass, compiled traces
        # included). A call with another x computes afresh.
        if self.x is not x:
            self.x, self.parts = x, mx.split(self.linear(x), self.starts[1:-1], axis=-1)
            self.pending = self.consumers
        part = self.parts[index]
        self.pending -= 1
        if self.pending == 0:
            self.x = self.parts = None
        return part


class ProjectionSlice(nn.Module):
    """Columns [start, start + output_dims) of a stacked product, in place of one projection layer."""

    def __init__(self, product: _StackedProduct, index: int, output_dims: int):
        super().__init__()
        self._product = product
        self._index = index
        self.output_dims = output_dims

    def _extra_repr(self) -> str:
        return f"part={self._index}, output_dims={self.output_dims}"

    def unstacked(self) -> GGMLLinear:
        """This projection alone: a GGMLLinear over its rows of the stacked weight (a view, no copy; a copy of
        the rows unpacked where the stack's rows are packed for the CPU)."""
        stacked = self._product.linear
        start, stop = self._product.starts[self._index], self._product.starts[self._index + 1]
        bias = stacked.get("bias")
        return GGMLLinear(GGMLTensor(stacked.tensor.data[start:stop], stacked.ggml_type, (stop - start,
                                                                                        stacked.input_dims)),
                          None if bias is None else bias[start:stop], precise_x=stacked.precise_x)

    def to_lora(self, r: int = 8, scale: float = 20.0, dropout: float = 0.0):
        """mlx-lm's LoRA layer (mlx_lm.tuner.linear_to_lora_layers) over this projection alone; the others keep
        the stacked product."""
        self._product.consumers -= 1
        alone = self.unstacked()
        if "bias" in alone and "bias" not in self._product.linear.trainable_parameters():
            alone.freeze(keys=["bias"])  # as frozen as the stack it came from (linear_to_lora_layers freezes first)
        return alone.to_lora(r=r, scale=scale, dropout=dropout)

    def __call__(self, x: mx.array) -> mx.array:
        return self._product.part(self._index, x)


def stack_attention_projections(attention: nn.Module) -> None:
    """q_proj/k_proj/v_proj of one block type (the largest such group, at least 2) into one product."""
    names = [n for n in ("q_proj", "k_proj", "v_proj") if n in attention]
    if len(names) < 2:
        return
    by_type = {}
    for name in names:
        by_type.setdefault(getattr(attention[name], "ggml_type", None), []).append(name)
    group = max(by_type.values(), key=len)
    layers = [attention[name] for name in group]
    if not stackable(layers):
        return
    attention.fused_proj = stack_linears(layers)
    product = _StackedProduct(attention, "fused_proj", [layer.output_dims for layer in layers])
    for index, (name, layer) in enumerate(zip(group, layers)):
        attention[name] = ProjectionSlice(product, index, layer.output_dims)
