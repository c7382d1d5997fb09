"""The realtime session as a sans-I/O state machine (as websockets' ``protocol.py`` is for frames).

``core.RealtimeSession`` takes client events, audio-in stage events and response outputs in, and gives
server events and pipeline commands out; it owns no sockets and no tasks. ``turn`` owns turn-taking and
held (speculative) answers, ``response`` the response state machine, ``conversation`` the items. The
transports (``omni_rt.transports``) drive it.
"""
