"""The shared vocabulary: the bottom layer, importable by every other layer and importing none of them.

What crosses a boundary between layers lives here, so producers and consumers agree by type:
``payloads`` (stage stream chunks and audio-in session events), ``turn_detection`` (the parsed
``turn_detection`` config and its numbers), ``rates`` (the pipeline's sample rates).
"""
