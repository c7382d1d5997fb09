"""AR engines behind the thinker/talker stages.

Message contract (every backend: built-in ``ARScheduler``, ``RemoteThinker``, ``SGLangThinker``):

- ``new_request`` data: ``messages`` (chat, templated with add_generation_prompt) or ``prompt_ids``; optional
  ``session_id`` (prefix-reuse key), ``max_tokens``, sampling keys ``temperature`` (0 = greedy), ``top_p``,
  ``top_k``, ``min_p``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``,
  ``no_repeat_ngram_size``, ``seed`` (absent = the preset's ``sampling`` default), ``answer_policy``
  (``{"max_sentences", "max_words"}``; absent = the preset's; see ``answer_policy``), ``stop`` (strings),
  ``stop_token_ids``, ``ignore_eos``, ``output`` ("text" | "tokens"); function calling
  (``omni_rt.engine.tools``: ``schema``, ``prompt``, ``parser``): ``tools`` (Realtime flat function
  tools), ``tool_choice`` (auto | none | required | {"type": "function", "name"}; forced ones decode under a
  JSON-schema grammar), ``parallel_tool_calls``, and OpenAI chat tool messages (assistant ``tool_calls``,
  role ``tool``).
- ``stream`` out (``omni_rt.contracts.payloads``): ``TextDelta(text, token_ids)`` as tokens are produced (text
  never splits a character nor leaks the start of a stop string; with an answer policy, exactly what will be
  spoken). A tool call streams as ``ToolCallDelta(index, call_id, name, arguments_delta)`` and, once its
  arguments are whole, ``ToolCallDone(index, call_id, name, arguments)``; its text never reaches a ``TextDelta``.
- ``result`` out: ``{"text", "token_ids", "finish_reason": stop|length|abort|policy|tool_calls, "prompt_tokens",
  "cached_tokens", "prefilled_tokens", "completion_tokens", "ttft_ms"}`` (+ ``"tool_calls": [{"call_id", "name",
  "arguments"}]``, complete calls only; "text" is the spoken text without the call markup).
- ``error`` out: data = message, ``metadata["code"]``; only the failing request is affected.

Build one with ``omni_rt.engine.factory.create_ar_scheduler``. Nothing heavy is imported here.

The subpackages, by job:

- ``builtin/``: the built-in PyTorch engine — ``ar_scheduler`` (continuous batching, chunked prefill, prefix
  restore) over ``torch_engine`` (the model runner), ``kv_cache``, ``prefix_cache``, ``attention`` and
  ``paged_attention``, ``sampling``, ``sequence`` / ``sequence_builder``, ``token_publisher``,
  ``tool_decoding``, ``segments`` (streamed requests), ``heap``.
- ``llama_cpp/``: the CPU thinker — ``build`` (``python -m omni_rt.engine.llama_cpp build``), ``server`` (the
  supervised ``llama-server`` and its command line, ``LlamaServerArgs``), ``thinker``, ``prefill_pieces``,
  ``decode_pacing``.
- ``streamed/``: engines whose tokens arrive as a stream — ``async_stream`` (their base), ``remote`` (any
  OpenAI-compatible endpoint), ``sglang_engine``; and ``openai_compat_server``, which serves an engine that way.
- ``tools/``: function calling — ``schema``, ``prompt``, ``parser``, ``grammar`` (constrained decoding).
- ``prompt/``: shared by every engine — ``request``, ``history``, ``prefix`` (token prefix arithmetic),
  ``language``, ``answer_policy``, ``detokenize``.
- ``weights/``: ``loader``, ``smollm2`` (the CPU preset's thinker files), ``random_init``, ``thinker_choice``.
"""
