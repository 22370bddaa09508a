"""mlx-ggml-ext: ggml's quantized formats and operations as native MLX primitives."""

from importlib.metadata import PackageNotFoundError, version as _version

import mlx.core as mx

try:
    from . import _ext
except ImportError as e:  # e.g. `python -m mlx_ggml_ext` run inside the source checkout
    raise ImportError(
        "mlx_ggml_ext's compiled extension (_ext) was not found next to "
        f"{__file__}. If this is the source tree, install the package (pip install .) "
        "and run from another directory, or use the `mlx-ggml-ext` command.") from e

from . import gguf, ops
from .types import GGMLTensor, GGMLType
from ._ext import cpu_isa, cpu_isas, num_threads, set_cpu_isa, set_num_threads

try:
    __version__ = _version("mlx-ggml-ext")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+source"


def backends() -> dict:
    """Which devices this installation can run the ops on."""
    built_for = _ext.gpu_backend()
    return {
        "cpu": True,
        "cuda": built_for == "cuda" and mx.cuda.is_available(),
        "metal": built_for == "metal" and mx.metal.is_available(),
        "gpu_backend_built": built_for,
    }


__all__ = ["ops", "gguf", "GGMLType", "GGMLTensor", "backends", "cpu_isa", "cpu_isas", "set_cpu_isa", "num_threads",
           "set_num_threads", "__version__"]
