"""The realtime session as a sans-I/O state machine (as websockets' ``protocol.py`` is for frames).

``core.RealtimeSession`` takes client events, audio-in stage events and response outputs in, and gives
server events and pipeline commands out; it owns no sockets and no tasks. It coordinates plain parts, each
with its own state: ``outbox`` (outgoing events), ``conversation`` (the items), ``turn_taking`` (audio-in events
by turn, over ``turn``), ``response_lifecycle`` (starting, streaming, ending answers; the record and its state
machine in ``response_state``), ``held_answers`` (speculative answers) and ``tool_call_items``; ``handlers``
validates client events. The transports (``omni_rt.transports``) drive it.
"""
