"""What every engine does before and after decoding: ``request`` (parse a request), ``history`` (the token budget
of a session's conversation), ``prefix`` (token prefix arithmetic), ``language`` (language steering),
``answer_policy`` (where a voice answer stops), ``detokenize`` (token ids to text that never splits a character).

Importing any of them imports no torch (``language`` imports it only to build a vocabulary mask), so the
llama.cpp and remote thinkers start without it.
"""
