"""``omni-rt serve --thinker FILE.gguf``: wrong local choices (a missing path, a directory, a file that is no
GGUF, a GGUF without a chat template, written here by the ``gguf`` package) fail with one line, and a good one
gives the llama.cpp thinker. Servers as the thinker and real turns: tests/integration/test_thinker_choice.py.
"""

from __future__ import annotations

import pytest
from tiny_models import metadata_gguf

from omni_rt.engine.llama_cpp import build as llama_cpp
from omni_rt.engine.llama_cpp.server import LlamaServer, LlamaServerArgs
from omni_rt.engine.streamed.openai_compat_server import ServerThread
from omni_rt.engine.weights.thinker_choice import ThinkerError, thinker_args
from omni_rt.engine.weights.smollm2 import packaged_gguf_path


def test_wrong_gguf_choices_fail_with_one_clear_line(tmp_path):
    cases = {
        str(tmp_path / "missing.gguf"): "no such file",
        str(tmp_path): "is a directory",
        str(tmp_path / "notes.gguf"): "not a GGUF file",
        str(metadata_gguf(tmp_path / "base.gguf", None)): "no chat template",
    }
    (tmp_path / "notes.gguf").write_text("this is not a model")
    for spec, why in cases.items():
        with pytest.raises(ThinkerError) as err:
            thinker_args(spec)
        assert why in str(err.value) and "\n" not in str(err.value), err.value
    chat = metadata_gguf(tmp_path / "chat.gguf", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert thinker_args(str(chat)) == {"backend": "llama.cpp", "model": str(chat.resolve()), "tokenizer": str(chat.resolve())}
