"""One way to find and open an ONNX model on CPU for the small per-session models (Silero VAD, Smart Turn).

Few threads and no spinning: on a 2-core box these run beside Whisper, Piper and the thinker, and an
onnxruntime pool spinning on a busy core costs more than its parallelism gains.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import onnxruntime as ort


def packaged_file(module: str, relpath: str, missing: str, absent: str) -> Path:
    """``relpath`` inside the installed package ``module``, found without importing it (silero_vad would import
    torch, pipecat loguru and asyncio patches). ``missing``: the message when the package is not installed;
    ``absent``: when it is but the file is not (``{path}`` is filled in)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(missing)
    path = Path(next(iter(spec.submodule_search_locations))) / relpath
    if not path.is_file():
        raise FileNotFoundError(absent.format(path=path))
    return path


def cpu_session(path: str | Path, intra_op_threads: int = 1) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
