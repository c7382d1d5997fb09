"""The pipeline's rates: its two sample rates (``omni_rt.audio`` re-exports them) and the speaking rate.

Inside the pipeline audio is float32 mono at ``PIPELINE_INPUT_RATE`` into VAD/ASR and PCM16 at
``PIPELINE_OUTPUT_RATE`` out of the vocoder.
"""

PIPELINE_INPUT_RATE = 16000  # what Silero VAD and Whisper take
PIPELINE_OUTPUT_RATE = 24000  # what the vocoder stage emits (the Realtime protocol's audio/pcm rate)

# A lower bound on how long a word takes to say (Piper's voices and Orpheus speak ~150-170 words a minute, 0.35-0.4
# s a word): how far an answer's text runs ahead of its playback, estimated so that it errs early (the talker's
# clause due times, omni_rt.stages.talker.clause_stream; the llama.cpp thinker's pacing, omni_rt.engine.llama_cpp.decode_pacing)
SPEECH_S_PER_WORD = 0.3
