"""llama.cpp as the CPU thinker: ``build`` (build ``llama-server`` once, find the cached binary), ``server``
(one supervised ``llama-server`` and its command line, ``LlamaServerArgs``), ``thinker`` (the scheduler that
drives it), ``prefill_pieces`` and ``decode_pacing`` (how it shares the server's batch between sessions).

``python -m omni_rt.engine.llama_cpp build`` (or ``locate``): see ``build``. Importing this package imports
nothing, so that command runs before anything else is installed.
"""
