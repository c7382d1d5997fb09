"""Engines whose tokens stream in from elsewhere: ``async_stream`` (the asyncio scheduler base they share),
``remote`` (any OpenAI-compatible endpoint), ``sglang_engine`` (SGLang in-process), and
``openai_compat_server`` (the other direction: serves a built-in engine as an OpenAI-compatible endpoint).
"""
