"""Language steering: keep the thinker in the languages the preset's talker can speak.

Two levers, both built from the preset's ``languages`` list (ISO 639-1 codes):
* the prompt: one sentence appended to the system message (added the same way every turn, so the session's
  cached prefix still matches);
* a vocabulary mask (built once per tokenizer) that bans tokens holding letters of other scripts. For an
  English-only voice that means every non-ASCII letter and every partial-UTF-8 byte token, which also makes
  French/Spanish accents unavailable: a small model asked "Quelle est la capitale de la France ?" then
  answers in English instead of in text the voice would garble. Latin languages with accents cannot be told
  apart from English by script, so there only the prompt steers.
"""

from __future__ import annotations

import logging
import unicodedata
from typing import Any, Iterable

import torch

log = logging.getLogger(__name__)

# code -> (name for the prompt, Unicode script name prefixes of its letters; () = ASCII letters only)
LANGUAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "en": ("English", ()),
    "fr": ("French", ("LATIN",)),
    "de": ("German", ("LATIN",)),
    "es": ("Spanish", ("LATIN",)),
    "it": ("Italian", ("LATIN",)),
    "pt": ("Portuguese", ("LATIN",)),
    "nl": ("Dutch", ("LATIN",)),
    "pl": ("Polish", ("LATIN",)),
    "tr": ("Turkish", ("LATIN",)),
    "vi": ("Vietnamese", ("LATIN",)),
    "ru": ("Russian", ("CYRILLIC",)),
    "uk": ("Ukrainian", ("CYRILLIC",)),
    "el": ("Greek", ("GREEK",)),
    "zh": ("Chinese", ("CJK",)),
    "ja": ("Japanese", ("CJK", "HIRAGANA", "KATAKANA")),
    "ko": ("Korean", ("HANGUL",)),
    "ar": ("Arabic", ("ARABIC",)),
    "he": ("Hebrew", ("HEBREW",)),
    "hi": ("Hindi", ("DEVANAGARI",)),
}


def check_languages(languages: Iterable[str] | None) -> tuple[str, ...]:
    """Validate a preset's ``languages``; a clear error names the ones we know."""
    if not languages:
        return ()
    if isinstance(languages, str):
        languages = [languages]
    out = []
    for code in languages:
        if not isinstance(code, str) or code.lower() not in LANGUAGES:
            raise ValueError(f"unknown language {code!r}; known: {', '.join(sorted(LANGUAGES))}")
        out.append(code.lower())
    return tuple(out)


def steering_sentence(languages: tuple[str, ...]) -> str:
    names = [LANGUAGES[c][0] for c in languages]
    said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
    return f"Always reply in {said}, even when the user writes in another language."


def steer_messages(messages: list[dict[str, Any]], languages: tuple[str, ...]) -> list[dict[str, Any]]:
    """The chat with the language sentence at the end of its system message (one is added if absent)."""
    if not languages:
        return messages
    sentence = steering_sentence(languages)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        content = first.get("content") or ""
        first["content"] = f"{content.rstrip()} {sentence}" if content.strip() else sentence
        return [first, *messages[1:]]
    return [{"role": "system", "content": sentence}, *messages]


def _letter_allowed(c: str, scripts: tuple[str, ...]) -> bool:
    if c.isascii():
        return True
    name = unicodedata.name(c, "")
    return any(name.startswith(s) for s in scripts)


def vocab_mask(tokenizer: Any, languages: tuple[str, ...], vocab_size: int) -> torch.Tensor | None:
    """[vocab_size] bool, True for tokens the voice cannot say; ``None`` when nothing needs banning."""
    if not languages or tokenizer is None:
        return None
    scripts = tuple(s for c in languages for s in LANGUAGES[c][1])
    ascii_only = not scripts
    n = min(vocab_size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(n)], skip_special_tokens=False)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    ban = torch.zeros(vocab_size, dtype=torch.bool)
    for i, text in enumerate(texts):
        if i in special:
            continue
        if "\ufffd" in text:
            ban[i] = ascii_only  # a partial UTF-8 byte: only ever part of a non-ASCII character
        elif any(c.isalpha() and not _letter_allowed(c, scripts) for c in text):
            ban[i] = True
    log.info("language steering %s: %d of %d tokens banned", ",".join(languages), int(ban.sum()), vocab_size)
    return ban if ban.any() else None
