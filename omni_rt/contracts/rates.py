"""The pipeline's two sample rates: what every stage agrees on (``omni_rt.audio`` re-exports them).

Inside the pipeline audio is float32 mono at ``PIPELINE_INPUT_RATE`` into VAD/ASR and PCM16 at
``PIPELINE_OUTPUT_RATE`` out of the vocoder.
"""

PIPELINE_INPUT_RATE = 16000  # what Silero VAD and Whisper take
PIPELINE_OUTPUT_RATE = 24000  # what the vocoder stage emits (the Realtime protocol's audio/pcm rate)
