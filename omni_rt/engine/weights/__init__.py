"""Which thinker weights run and where they come from: ``loader`` (Hugging Face models and tokenizers),
``smollm2`` (the CPU preset's packaged SmolLM2 and its served GGUF), ``random_init`` (random weights of a real
shape), ``thinker_choice`` (``--thinker``: a GGUF, a hub repo or a remote endpoint).
"""
