"""Audio formats and conversions have one owner: this package.

Inside the pipeline audio is float32 mono: ``PIPELINE_INPUT_RATE`` into VAD/ASR, ``PIPELINE_OUTPUT_RATE`` out
of the vocoder (as PCM16); the rates themselves are shared vocabulary (``omni_rt.contracts.rates``). Wire
formats and their rates live in ``formats``.
"""

from omni_rt.contracts.rates import PIPELINE_INPUT_RATE, PIPELINE_OUTPUT_RATE

__all__ = ["PIPELINE_INPUT_RATE", "PIPELINE_OUTPUT_RATE"]
