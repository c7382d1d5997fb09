"""Helpers shared by the test suite and ``latency_bench``: drive a stage in-process (``stage_driver``), call the
server over WebRTC as a client would (``webrtc_client``), the labelled spoken end-of-turn set (``turn_set``) and
its stage-level scoring (``turn_scores``), and a simulated 24 kHz player (``playback``).

Nothing in ``omni_rt`` imports this package; it may use any install dependency, and it never imports
``latency_bench`` (the bench imports it, not the other way round). Importing ``omni_rt.testing`` itself loads
nothing: import the module you need.
"""
