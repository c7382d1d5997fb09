"""AR engines behind the thinker/talker stages.

Message contract (every backend: built-in ``ARScheduler``, ``RemoteScheduler``, ``SGLangScheduler``):

- ``new_request`` data: ``messages`` (chat, templated with add_generation_prompt) or ``prompt_ids``; optional
  ``session_id`` (prefix-reuse key), ``max_tokens``, sampling keys ``temperature`` (0 = greedy), ``top_p``,
  ``top_k``, ``min_p``, ``repetition_penalty``, ``frequency_penalty``, ``presence_penalty``,
  ``no_repeat_ngram_size``, ``seed`` (absent = the preset's ``sampling`` default), ``answer_policy``
  (``{"max_sentences", "max_words"}``; absent = the preset's; see ``answer_policy``), ``stop`` (strings),
  ``stop_token_ids``, ``ignore_eos``, ``output`` ("text" | "tokens").
- ``stream`` out: ``{"text": delta, "token_ids": [...]}`` as tokens are produced (text never splits a character
  nor leaks the start of a stop string). With an answer policy, ``text`` is exactly what will be spoken.
- ``result`` out: ``{"text", "token_ids", "finish_reason": stop|length|abort|policy, "prompt_tokens", "cached_tokens",
  "prefilled_tokens", "completion_tokens", "ttft_ms"}``.
- ``error`` out: data = message, ``metadata["code"]``; only the failing request is affected.

Build one with ``omni_rt.engine.factory.create_ar_scheduler``. Nothing heavy is imported here.
"""
