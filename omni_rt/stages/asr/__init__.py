"""The ASR stage (the pipeline's audio-in stage): VAD, turn taking and streaming Whisper, one state per session.

``stage`` (``AsrWorker``: the per-session state machine on a session scheduler), ``factory``
(``create_asr_stage``: what presets name), its components ``turn_audio`` (VAD segmentation), ``decoding`` (the
shared Whisper worker) and ``turn_scoring`` (Smart Turn's score per pause), and ``turn_rule`` (what
``turn_detection`` means: eagerness, the words' cue, the silences). Its ops and replies are contract types
(``omni_rt.contracts.audio_in``); its events are ``omni_rt.contracts.payloads``.
"""
