"""Config -> CUDA source. One jinja2 Environment with StrictUndefined; `render` is a pure function."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jinja2

from autotile.codegen.dtypes import DTYPES, HALF_DTYPES, output_ctype
from autotile.codegen.resources import templates_dir

# CUDA's vector types of the raw storage types (`unsigned short2` is no type; `ushort2` is)
_VECTOR_BASE = {"unsigned short": "ushort", "unsigned char": "uchar"}


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The one template environment: a missing variable is an error, never an empty string."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def kernel_function_name(kernel: str) -> str:
    """The extern "C" name of the generated kernel."""
    return f"autotile_{kernel}"


def render(template: str, kernel: str, config: Mapping[str, Any], dtype: str = "float32",
           layout: str = "row", config_key: str | None = None, geometry: Mapping[str, Any] | None = None,
           batched: bool = False) -> str:
    """The CUDA source of `kernel` for one config. Same inputs, same text. `config_key` is the config's
    line in the source's header comment (every name=value when None); `geometry` holds the space's derived
    values (threads, block shape, tile strides, ...), which the template uses as they are, so that the
    kernel and its launcher read the same numbers. `batched`: the kernel computes a batch of problems
    along grid z (bmm)."""
    key = config_key if config_key is not None else ",".join(f"{k}={v}" for k, v in config.items())
    context = dict(geometry or {})
    context.update(config)
    context.update(kernel_name=kernel_function_name(kernel), dtype=dtype, ctype=DTYPES[dtype].ctype,
                   out_ctype=output_ctype(dtype), acc_ctype=accumulator_ctype(dtype),
                   dtype_size=DTYPES[dtype].size, layout=layout, config_key=key, batched=batched,
                   vec_type=lambda n: f"{_VECTOR_BASE.get(DTYPES[dtype].ctype, DTYPES[dtype].ctype)}{n}")
    return environment().get_template(template).render(**context)


def accumulator_ctype(dtype: str) -> str:
    """The C type a CUDA-core kernel sums `dtype`'s products in: float for the 16-bit floats (their widened
    values; the result is rounded once, at the end), else `T` itself, written as `T` so that the float32
    and float64 kernels' text (and the source hashes of their tuned records) reads as it always has."""
    return "float" if dtype in HALF_DTYPES else "T"
