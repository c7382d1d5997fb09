"""The F16 GGUF llama.cpp serves for the CPU preset: the packaged Q4_1 weights dequantized, nothing else changed."""

from __future__ import annotations

import gguf
import numpy as np
from gguf.quants import dequantize

from omni_rt.engine import smollm2


def test_widened_file_keeps_metadata_and_dequantizes_every_quantized_tensor(tmp_path):
    path = smollm2.ensure_f16_gguf(tmp_path)
    assert path == tmp_path / smollm2.F16_GGUF and smollm2.ensure_f16_gguf(tmp_path) == path  # once, then cached
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    source, wide = gguf.GGUFReader(smollm2.packaged_gguf_path()), gguf.GGUFReader(path)

    keys = [k for k in source.fields if not k.startswith("GGUF.")]
    assert [k for k in wide.fields if not k.startswith("GGUF.")] == keys
    for key in keys:
        expected = smollm2.GGML_FILE_TYPE_F16 if key == "general.file_type" else source.fields[key].contents()
        assert wide.fields[key].contents() == expected, key

    by_name = {t.name: t for t in wide.tensors}
    assert [t.name for t in wide.tensors] == [t.name for t in source.tensors]
    for tensor in source.tensors:
        out = by_name[tensor.name]
        assert list(out.shape) == list(tensor.shape), tensor.name
        if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
            assert out.tensor_type == gguf.GGMLQuantizationType.F32
            np.testing.assert_array_equal(out.data, tensor.data)
        else:
            assert out.tensor_type == gguf.GGMLQuantizationType.F16, tensor.name
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight"):  # Q8_0 and Q4_1 sources
        src = next(t for t in source.tensors if t.name == name)
        np.testing.assert_allclose(np.asarray(by_name[name].data, np.float32),
                                   dequantize(src.data, src.tensor_type), rtol=1e-3, atol=1e-4)
