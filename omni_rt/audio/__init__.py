"""Audio formats and sample rates have one owner: this package.

Inside the pipeline audio is float32 mono: ``PIPELINE_INPUT_RATE`` into VAD/ASR, ``PIPELINE_OUTPUT_RATE`` out
of the vocoder (as PCM16). Wire formats and their rates live in ``formats``.
"""

PIPELINE_INPUT_RATE = 16000  # what Silero VAD and Whisper take
PIPELINE_OUTPUT_RATE = 24000  # what the vocoder stage emits (the Realtime protocol's audio/pcm rate)
