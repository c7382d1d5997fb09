"""The GGUF llama.cpp serves for the CPU preset: the packaged weights (Q4_1, a Q8_0 token embedding) in the
preset's ``gguf_format``, nothing else changed. Each case converts the packaged model (the packaging step that
``omni-rt prepare`` runs), so these are integration tests."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from omni_rt.engine.weights import smollm2

TARGET = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "f16": gguf.GGMLQuantizationType.F16}


@pytest.mark.parametrize("fmt", list(smollm2.SERVED_FORMATS))
def test_served_file_keeps_metadata_and_converts_every_matrix(tmp_path, fmt):
    path = smollm2.ensure_served_gguf(fmt, tmp_path)
    assert path == tmp_path / smollm2.served_gguf_name(fmt) and smollm2.ensure_served_gguf(fmt, tmp_path) == path  # once
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    source, served = gguf.GGUFReader(smollm2.packaged_gguf_path()), gguf.GGUFReader(path)

    keys = [k for k in source.fields if not k.startswith("GGUF.")]
    assert [k for k in served.fields if not k.startswith("GGUF.")] == keys
    for key in keys:
        expected = smollm2.SERVED_FORMATS[fmt] if key == "general.file_type" else source.fields[key].contents()
        assert served.fields[key].contents() == expected, key

    by_name = {t.name: t for t in served.tensors}
    assert [t.name for t in served.tensors] == [t.name for t in source.tensors]
    for tensor in source.tensors:
        out = by_name[tensor.name]
        assert list(out.shape) == list(tensor.shape), tensor.name
        if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, TARGET[fmt]):  # copied as they are
            assert out.tensor_type == tensor.tensor_type, tensor.name
            np.testing.assert_array_equal(out.data, tensor.data)
        else:
            assert out.tensor_type == TARGET[fmt], tensor.name
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight"):  # Q8_0 and Q4_1 sources
        src = next(t for t in source.tensors if t.name == name)
        want = dequantize(src.data, src.tensor_type).astype(np.float32)
        got = dequantize(by_name[name].data, by_name[name].tensor_type).astype(np.float32)
        if fmt == "f16":
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)
        else:  # Q8_0: within half a step (the block's largest magnitude / 127) of each value, plus what rounding
            # the block's scale to F16 moves its largest level (127 steps x 2^-11)
            blocks_want, blocks_got = want.reshape(-1, 32), got.reshape(-1, 32)
            step = np.abs(blocks_want).max(axis=1, keepdims=True) / 127
            assert (np.abs(blocks_got - blocks_want) <= step * (0.5 + 127 * 2.0**-11) + 1e-7).all(), name
