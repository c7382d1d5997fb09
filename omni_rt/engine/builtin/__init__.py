"""The built-in PyTorch engine: the AR scheduler (continuous batching, prefix reuse), the model runner and its KV
cache, attention (packed GQA, paged), batched sampling, sequences, token publishing and tool decoding.

Build it with ``omni_rt.engine.factory.create_ar_scheduler`` (``backend: torch``). Importing this package
imports nothing; its modules import torch.
"""
