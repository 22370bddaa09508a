"""mlx.nn layers over ggml weights: swap a model's Linear layers for GGUF tensors without requantizing."""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from . import _ext
from .ops import _PACKED_BLOCK_BYTES, PACKABLE_TYPES, evaluate_ids_on_gpu
from .types import GGMLTensor, GGMLType


def _matrix_shape(weight: GGMLTensor, axes: str) -> tuple:
    if not isinstance(weight, GGMLTensor):
        raise TypeError(f"weight must be a GGMLTensor, got {type(weight).__name__}")
    if len(weight.shape) != 2:
        raise ValueError(f"weight must be 2-D {axes}, got shape {weight.shape}")
    return weight.shape


def packable(ggml_type: GGMLType, rows: int) -> bool:
    """Whether a matrix of `rows` rows of this type can be packed for the CPU (ops.pack_rows)."""
    return ggml_type in PACKABLE_TYPES and rows % 8 == 0


def _packed_bytes(module: nn.Module, rows: int) -> int:
    """Bytes pack_rows' copy of the module's weight (`rows` rows per matrix) would take, 0 where it would not pack:
    its blocks times the packed bytes per block (Q4_K_R8 is 2.8% larger than the blocks). Counted, not packed:
    pack_rows runs eagerly."""
    if module.packed or not packable(module.ggml_type, rows):
        return 0
    return module["weight"].nbytes // module.ggml_type.type_size * _PACKED_BLOCK_BYTES[module.ggml_type]


class _PackableRows:
    """What GGMLLinear and GGMLSwitchLinear share about their weight's layout: ``kernel_type`` is what the products
    read (the ggml type, or its packed id once :meth:`pack_rows` ran)."""

    @property
    def packed(self) -> bool:
        """Whether the weight is held as rows packed for the CPU (:meth:`pack_rows`)."""
        return self.kernel_type != int(self.ggml_type)

    def pack_rows(self) -> bool:
        """Replaces the weight (for experts: every expert's, each expert's N rows in groups of 8) with its rows
        packed for the CPU's products (:func:`mlx_ggml_ext.ops.pack_rows`: a copy, 1.3-3x faster on AVX-512; the GPU
        refuses it). Returns whether it did: only weights of :data:`ops.PACKABLE_TYPES` with a multiple of 8 rows
        (per expert) are packed."""
        if not self.pack_rows_bytes():
            return False
        self.weight = _ext.pack_rows(self["weight"], int(self.ggml_type))  # (E N, bytes): groups never span experts
        self.kernel_type = _ext.packed_type(int(self.ggml_type))
        return True

    def pack_rows_bytes(self) -> int:
        """Bytes the packed copy of :meth:`pack_rows` would take (0 where it would not pack)."""
        return _packed_bytes(self, self.output_dims)

    def _blocks(self) -> mx.array:
        """The weight as the file's blocks (a packed one unpacked: a copy)."""
        return _ext.unpack_rows(self["weight"], self.kernel_type) if self.packed else self["weight"]


class GGMLLinear(_PackableRows, nn.Module):
    """``y = x @ W^T + bias`` with W kept as ggml blocks (any :class:`GGMLType`).

    The weight's bytes are a frozen parameter (``weight``, uint8 ``(N, bytes_per_row)``), so
    ``trainable_parameters()`` holds only the bias and gradients flow to x: a float adapter (e.g. LoRA)
    can train on top of the quantized base. ``precise_x``: as in :func:`mlx_ggml_ext.ops.quantized_matmul`.
    """

    def __init__(self, weight: GGMLTensor, bias: Optional[mx.array] = None, *, precise_x: bool = False):
        super().__init__()
        if not isinstance(precise_x, bool):
            raise TypeError(f"precise_x must be a bool, got {type(precise_x).__name__}")
        self.precise_x = precise_x
        self.output_dims, self.input_dims = _matrix_shape(weight, "(output_dims, input_dims)")
        self.ggml_type = weight.ggml_type
        self.kernel_type = int(weight.ggml_type)  # what the product reads: the type, or its packed id
        self.weight = weight.data
        if bias is not None:
            if not isinstance(bias, mx.array):
                raise TypeError(f"bias must be an mlx.core.array, got {type(bias).__name__}")
            if tuple(bias.shape) != (self.output_dims,):
                raise ValueError(f"bias must have shape ({self.output_dims},), got {tuple(bias.shape)}")
            self.bias = bias
        self.freeze(keys=["weight"])

    def unfreeze(self, *args, **kwargs):
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False, keys=["weight"])  # raw blocks have no gradient
        return self

    def to_lora(self, r: int = 8, scale: float = 20.0, dropout: float = 0.0):
        """mlx-lm's LoRA layer over this one (mlx_lm.tuner.linear_to_lora_layers calls it): the adapter's
        float matrices train, the blocks stay frozen."""
        from mlx_lm.tuner.lora import LoRALinear
        lora = LoRALinear(self.input_dims, self.output_dims, r=r, dropout=dropout, scale=scale)
        lora.linear = self
        return lora

    @property
    def tensor(self) -> GGMLTensor:
        """The weight as ggml blocks (a packed weight unpacked: a copy)."""
        return GGMLTensor(self._blocks(), self.ggml_type, (self.output_dims, self.input_dims))

    def _extra_repr(self) -> str:
        return (f"input_dims={self.input_dims}, output_dims={self.output_dims}, "
                f"ggml_type={GGMLType(self.ggml_type).name}, bias={'bias' in self}"
                + (", packed_rows=True" if self.packed else "") + (", precise_x=True" if self.precise_x else ""))

    def __call__(self, x: mx.array) -> mx.array:
        # Items read as dict items, not attributes: nn.Module's attribute fallback costs ~2 us a lookup, and a
        # decode token calls a model's linear layers hundreds of times.
        y = _ext.quantized_matmul(x, self["weight"], self.kernel_type, precise_x=self.precise_x)
        bias = self.get("bias")
        return y if bias is None else y + bias


class GGMLEmbedding(nn.Module):
    """A token embedding table kept as ggml blocks: a lookup gathers the rows of the ids and dequantizes only
    those (never the whole table); :meth:`as_linear` computes a tied output head, ``x @ table^T``, on the
    blocks themselves. The table is a frozen parameter like :class:`GGMLLinear`'s weight."""

    def __init__(self, weight: GGMLTensor, dtype: mx.Dtype = mx.float32, *, precise_x: bool = False):
        super().__init__()
        if not isinstance(precise_x, bool):
            raise TypeError(f"precise_x must be a bool, got {type(precise_x).__name__}")
        self.precise_x = precise_x  # as_linear's default
        self.num_embeddings, self.dims = _matrix_shape(weight, "(num_embeddings, dims)")
        self.ggml_type = weight.ggml_type
        self.dtype = dtype
        self.weight = weight.data
        self.freeze(keys=["weight"])

    def unfreeze(self, *args, **kwargs):
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False, keys=["weight", "head_weight"] if self.packed else ["weight"])
        return self

    def _extra_repr(self) -> str:
        return (f"{self.num_embeddings}, {self.dims}, ggml_type={GGMLType(self.ggml_type).name}, "
                f"dtype={self.dtype}" + (", packed_head=True" if self.packed else ""))

    def __call__(self, ids: mx.array) -> mx.array:
        if not isinstance(ids, mx.array) or not mx.issubdtype(ids.dtype, mx.integer):
            raise TypeError(f"ids must be an integer mlx.core.array, got "
                            f"{getattr(ids, 'dtype', type(ids).__name__)}")
        flat = ids.reshape(-1)
        rows = mx.take(self.weight, flat, axis=0)
        out = _ext.dequantize(rows, int(self.ggml_type), [flat.size, self.dims], self.dtype)
        return out.reshape(*ids.shape, self.dims)

    @property
    def packed(self) -> bool:
        """Whether :meth:`as_linear` reads a copy of the table packed for the CPU (:meth:`pack_rows`)."""
        return "head_weight" in self

    def pack_rows(self) -> bool:
        """Gives :meth:`as_linear` a copy of the table with its rows packed for the CPU's products
        (:func:`mlx_ggml_ext.ops.pack_rows`); lookups keep reading the blocks. Worth it for a tied output head, the
        largest product of a small model. Returns whether it did (a type of :data:`ops.PACKABLE_TYPES` with a
        multiple of 8 rows)."""
        if not self.pack_rows_bytes():
            return False
        self.head_weight = _ext.pack_rows(self["weight"], int(self.ggml_type))
        self.head_type = _ext.packed_type(int(self.ggml_type))
        self.freeze(keys=["head_weight"])
        return True

    def pack_rows_bytes(self) -> int:
        """Bytes the head's packed copy of :meth:`pack_rows` would take (0 where it would not pack)."""
        return _packed_bytes(self, self.num_embeddings)

    def as_linear(self, x: mx.array, *, precise_x: Optional[bool] = None) -> mx.array:
        """``x @ table^T`` (a tied output head), on the blocks (``precise_x``: see :class:`GGMLLinear`; by
        default the one given to the constructor)."""
        precise = self.precise_x if precise_x is None else precise_x
        head = self.get("head_weight")
        if head is not None:
            return _ext.quantized_matmul(x, head, self.head_type, precise_x=precise)
        return _ext.quantized_matmul(x, self["weight"], self.ggml_type.value, precise_x=precise)


class GGMLSwitchLinear(_PackableRows, nn.Module):
    """mlx-lm's ``SwitchLinear`` (a mixture-of-experts projection) over E experts kept as ggml blocks: a drop-in
    for ``mlx_lm.models.switch_layers.SwitchLinear`` inside its ``SwitchGLU`` / ``SwitchMLP``.

    ``weight``: a :class:`GGMLTensor` of shape ``(E, N, K)`` (``num_experts, output_dims, input_dims``); ``bias``:
    optional float ``(E, N)``. ``__call__(x, indices, sorted_indices=False)`` takes what mlx-lm passes to
    ``mx.gather_mm``: x ``(..., X, 1, K)`` with X = 1 or indices' last axis, indices ``(..., n_used)``, and returns
    ``(..., n_used, 1, N)``; the product is :func:`ops.mul_mat_id` (tokens grouped by expert, so sorting them
    first is not needed). The blocks are frozen, as in :class:`GGMLLinear`. ``check_ids``: as in
    :func:`ops.mul_mat_id` (True: on a GPU the indices are evaluated and checked at every call, a synchronization;
    ``models.load`` sets False, its routers' top-k indices being in range by construction).
    """

    def __init__(self, weight: GGMLTensor, bias: Optional[mx.array] = None, *, check_ids: bool = True):
        super().__init__()
        if not isinstance(weight, GGMLTensor):
            raise TypeError(f"weight must be a GGMLTensor, got {type(weight).__name__}")
        if len(weight.shape) != 3:
            raise ValueError(f"weight must be 3-D (num_experts, output_dims, input_dims), got shape {weight.shape}")
        self.num_experts, self.output_dims, self.input_dims = weight.shape
        self.ggml_type = weight.ggml_type
        self.kernel_type = int(weight.ggml_type)  # as in GGMLLinear: the type, or its packed id
        if not isinstance(check_ids, bool):
            raise TypeError(f"check_ids must be a bool, got {type(check_ids).__name__}")
        self.check_ids = check_ids
        self.weight = weight.data
        if bias is not None:
            if not isinstance(bias, mx.array) or tuple(bias.shape) != (self.num_experts, self.output_dims):
                raise ValueError(f"bias must be an mlx.core.array of shape ({self.num_experts}, "
                                 f"{self.output_dims}), got {getattr(bias, 'shape', type(bias).__name__)}")
            self.bias = bias
        self.freeze(keys=["weight"])

    def unfreeze(self, *args, **kwargs):
        super().unfreeze(*args, **kwargs)
        self.freeze(recurse=False, keys=["weight"])
        return self

    @property
    def tensor(self) -> GGMLTensor:
        """The experts as ggml blocks (packed ones unpacked: a copy)."""
        return GGMLTensor(self._blocks(), self.ggml_type, (self.num_experts, self.output_dims, self.input_dims))

    def _extra_repr(self) -> str:
        return (f"num_experts={self.num_experts}, input_dims={self.input_dims}, output_dims={self.output_dims}, "
                f"ggml_type={GGMLType(self.ggml_type).name}, bias={'bias' in self}"
                + (", packed_rows=True" if self.packed else ""))

    def product(self, x: mx.array, ids: mx.array) -> mx.array:
        """x (T, 1 or n_used, K), ids (T, n_used) -> (T, n_used, N): the expert products, plus the bias."""
        if self.check_ids:
            evaluate_ids_on_gpu(ids)
        # Dict items, not attributes, as in GGMLLinear.__call__: called for every expert projection of a token.
        y = _ext.mul_mat_id(self["weight"], self.kernel_type, [self.num_experts, self.output_dims, self.input_dims],
                            x, ids)
        bias = self.get("bias")
        return y if bias is None else y + bias[ids]

    def __call__(self, x: mx.array, indices: mx.array, sorted_indices: bool = False) -> mx.array:
        if x.ndim < 2 or x.shape[-2] != 1:
            raise ValueError(f"x must be (..., X, 1, input_dims) as mlx-lm's SwitchLinear takes it, got {x.shape}")
        lead, used = tuple(indices.shape[:-1]), indices.shape[-1]
        slots = x.shape[-3] if x.ndim >= 3 else 1
        x = mx.broadcast_to(x, (*lead, slots, 1, x.shape[-1]))
        y = self.product(x.reshape(-1, slots, x.shape[-1]), indices.reshape(-1, used))
        return y.reshape(*lead, used, 1, self.output_dims)


def stack_experts(gate: GGMLSwitchLinear, up: GGMLSwitchLinear) -> Optional[GGMLSwitchLinear]:
    """One GGMLSwitchLinear whose expert e is gate's expert e over up's (2N rows: a copy), so that a token's gate
    and up products are one mul_mat_id (one pass of x's quantization and of the experts' dispatch instead of two);
    None when the two differ in type, shape, bias or packing."""
    if (gate.ggml_type != up.ggml_type or gate.packed or up.packed or ("bias" in gate) != ("bias" in up)
            or (gate.num_experts, gate.output_dims, gate.input_dims) != (up.num_experts, up.output_dims, up.input_dims)):
        return None
    E, N = gate.num_experts, gate.output_dims
    data = mx.concatenate([gate["weight"].reshape(E, N, -1), up["weight"].reshape(E, N, -1)], axis=1)
    bias = mx.concatenate([gate["bias"], up["bias"]], axis=1) if "bias" in gate else None
    mx.eval(data, *([bias] if bias is not None else []))  # once, at load
    return GGMLSwitchLinear(GGMLTensor(data.reshape(2 * E * N, -1), gate.ggml_type, (E, 2 * N, gate.input_dims)),
                            bias, check_ids=gate.check_ids and up.check_ids)


class GGMLSwitchGLU(nn.Module):
    """mlx-lm's ``SwitchGLU`` (``down(act(gate(x)) * up(x))`` through each token's experts) over three
    :class:`GGMLSwitchLinear`: ``__call__(x (..., K), indices (..., n_used)) -> (..., n_used, K)``. No sort of the
    tokens (mul_mat_id groups them by expert itself), and the activation is ``ops.glu`` of ``kind`` (with
    ``alpha`` and ``limit`` for ``"swiglu_oai"``, gpt-oss's clamped SwiGLU), applied after the projections'
    biases. With ``stack``, gate and up become one ``gate_up_proj`` of 2N rows per expert where they can
    (:func:`stack_experts`; a copy made here): one expert product for both."""

    def __init__(self, gate_proj: GGMLSwitchLinear, up_proj: GGMLSwitchLinear, down_proj: GGMLSwitchLinear,
                 kind: str = "swiglu", *, alpha: Optional[float] = None, limit: Optional[float] = None,
                 stack: bool = False):
        super().__init__()
        stacked = stack_experts(gate_proj, up_proj) if stack else None
        if stacked is None:
            self.gate_proj, self.up_proj = gate_proj, up_proj
        else:
            self.gate_up_proj = stacked
        self.down_proj = down_proj
        self.kind = kind
        # swiglu_oai's constants (None for the other kinds; plain floats, not module parameters)
        self._alpha = None if alpha is None else float(alpha)
        self._limit = None if limit is None else float(limit)

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        lead, used = tuple(indices.shape[:-1]), indices.shape[-1]
        rows = x.reshape(-1, 1, x.shape[-1])
        ids = mx.stop_gradient(indices).reshape(-1, used)
        if "gate_up_proj" in self:  # ggml's fused layout: the gate half, then the up half
            h = _ext.glu(self["gate_up_proj"].product(rows, ids), None, self.kind, alpha=self._alpha, limit=self._limit)
        else:
            gate, up = self.gate_proj.product(rows, ids), self.up_proj.product(rows, ids)
            h = _ext.glu(gate, up, self.kind, alpha=self._alpha, limit=self._limit)
        return self.down_proj.product(h, ids).reshape(*lead, used, self.down_proj.output_dims)


NameMap = Union[Mapping[str, str], Callable[[str], Optional[str]]]


class GGMLRMSNorm(nn.Module):
    """ggml's rms_norm times a weight, ``x / sqrt(mean(x^2) + eps) * weight``, as one primitive of this package
    (on the CPU, MLX's own rms_norm is a graph of several single-threaded ops). Drop-in for ``nn.RMSNorm``."""

    def __init__(self, dims: int, eps: float = 1e-5):
        super().__init__()
        self.weight = mx.ones((dims,))
        self.eps = eps

    def _extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"

    def __call__(self, x: mx.array) -> mx.array:
        return _ext.rms_norm(x, self["weight"], self.eps)  # a dict item: see GGMLLinear.__call__


def replace_linear_layers(model: nn.Module, tensors: Mapping[str, GGMLTensor], names: NameMap) -> list:
    """Replaces each ``nn.Linear`` of ``model`` whose module path (``"layers.0.attn.q_proj"``) maps, through
    ``names`` (a dict or a function returning None to skip), to a tensor in ``tensors`` by a
    :class:`GGMLLinear` over that tensor, keeping the layer's bias. Shapes must agree ((out, in) =
    the tensor's (N, K)). Returns the replaced paths."""
    lookup = names.get if isinstance(names, Mapping) else names
    replaced = []
    for path, module in model.named_modules():
        if not isinstance(module, (nn.Linear, GGMLLinear)) or not path:
            continue
        name = lookup(path)
        if name is None:
            continue
        if name not in tensors:
            raise KeyError(f"{path}: tensor {name!r} is not in the file")
        tensor = tensors[name]
        out_in = (module.weight.shape if isinstance(module, nn.Linear)
                  else (module.output_dims, module.input_dims))
        if tuple(out_in) != tuple(tensor.shape):
            raise ValueError(f"{path}: the layer is (out, in) = {tuple(out_in)} but tensor {name!r} has shape "
                             f"{tensor.shape}")
        bias = module["bias"] if "bias" in module else None
        replaced.append((path, GGMLLinear(tensor, bias)))
    if replaced:
        model.update_modules(tree_unflatten(replaced))
    return [p for p, _ in replaced]


def load_gguf_linears(model: nn.Module, path: str, names: NameMap) -> list:
    """Maps a GGUF file (no tensor bytes copied) and replaces ``model``'s Linear layers by its tensors as
    with :func:`replace_linear_layers`. Returns the replaced paths."""
    from . import gguf
    return replace_linear_layers(model, gguf.load(path).tensors, names)


__all__ = ["GGMLLinear", "GGMLEmbedding", "GGMLSwitchLinear", "GGMLSwitchGLU", "replace_linear_layers",
           "load_gguf_linears"]
