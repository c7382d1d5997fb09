"""The OpenAI Realtime wire vocabulary as pure data: errors, ids, event names, message parsing, session
config. No state machines and no I/O here (those are ``omni_rt.session`` and ``omni_rt.transports``)."""
