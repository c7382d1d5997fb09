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
import re
import unicodedata
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:  # torch only where a vocabulary mask is built: the llama.cpp and remote paths import this
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
    return f"Always reply in {said}, even when the user writes in another language or names foreign places."


def steer_messages(messages: list[dict[str, Any]], languages: tuple[str, ...]) -> list[dict[str, Any]]:
    """The chat with the language sentence at the end of its system message (one is added if absent), and
    every user turn that looks written in another language rewritten as 'Question (not in English): ...
    English answer:', which primes an English answer. Measured on SmolLM2-135M, five fr/es/de questions,
    both engines (fp32 torch and the Q4_1 llama.cpp GGUF, with the vocabulary bias): answers in English 5/5
    on each, where the earlier 'Translate this question to English and answer it in English: "..."' got 3/5
    and 2/5 (the rest in broken French; before that, a system sentence alone still got French and Spanish
    answers). Deterministic per message, so a session's cached prefix still matches."""
    if not languages:
        return messages
    sentence = steering_sentence(languages)
    name = LANGUAGES[languages[0]][0]
    out = []
    for m in messages:
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, str):
            lang = guess_language(content)
            if lang is not None and lang not in languages:
                m = {**m, "content": f"Question (not in {name}): {content}\n{name} answer:"}
        elif (m.get("role") == "assistant" and isinstance(content, str) and not m.get("tool_calls")
              and (not content.strip() or off_language(content, languages))):
            # an earlier answer in another language (or an empty one) is left out of the prompt: SmolLM2-135M
            # answered every later turn in the style of one Portuguese answer, and after one empty answer with
            # empty ones (issue #50); deterministic, so the prefix still matches
            continue
        out.append(m)
    if out and out[0].get("role") == "system":
        first = dict(out[0])
        content = first.get("content") or ""
        first["content"] = f"{content.rstrip()} {sentence}" if content.strip() else sentence
        return [first, *out[1:]]
    return [{"role": "system", "content": sentence}, *out]


def off_language(text: str, languages: tuple[str, ...]) -> bool:
    """Whether a sentence of ``text`` (3+ words) looks written in a language not in ``languages``."""
    import re

    parts = [p for p in re.split(r"(?<=[.!?])\s+|\n+", text) if len(p.split()) >= 3]
    return any((g := guess_language(p)) is not None and g not in languages for p in parts)


def _letter_allowed(c: str, scripts: tuple[str, ...]) -> bool:
    if c.isascii():
        return True
    name = unicodedata.name(c, "")
    return any(name.startswith(s) for s in scripts)


# function words of other languages that are not also English words ("con", "son", "was", "per" are): a soft
# logit bias against them keeps a small model from answering a French question in French-without-accents
_NOT_ENGLISH = frozenset("comment ton con son was per non come dove o as um do em is met van op hoe a die war".split())
FOREIGN_WORD_BIAS = -8.0


def vocab_bias(tokenizer: Any, languages: tuple[str, ...], vocab_size: int) -> torch.Tensor | None:
    """[vocab_size] float32 added to the logits: ``-inf`` for tokens of scripts the voice cannot say
    (``vocab_mask``), ``FOREIGN_WORD_BIAS`` for whole-word tokens that are function words of other
    Latin-script languages (soft, so "Los Angeles" or "Le Mans" still come out when the model is sure)."""
    import torch

    ban = vocab_mask(tokenizer, languages, vocab_size)
    if not languages or tokenizer is None:
        return None
    bias = torch.zeros(vocab_size, dtype=torch.float32)
    if ban is not None:
        bias.masked_fill_(ban, float("-inf"))
    allowed_words = set().union(*(_STOP_WORDS.get(c, frozenset()) for c in languages))
    foreign = {w for c, ws in _STOP_WORDS.items() if c not in languages for w in ws} - allowed_words - _NOT_ENGLISH
    for w in foreign:
        for form in (w, w.capitalize()):
            for text in (form, " " + form):
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if len(ids) == 1 and ids[0] < vocab_size and tokenizer.decode(ids).strip() == form:
                    bias[ids[0]] = min(float(bias[ids[0]]), FOREIGN_WORD_BIAS)
    return bias if bool((bias != 0).any()) else None


def vocab_mask(tokenizer: Any, languages: tuple[str, ...], vocab_size: int) -> torch.Tensor | None:
    """[vocab_size] bool, True for tokens the voice cannot say; ``None`` when nothing needs banning."""
    import torch

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


# A cheap language guess for steering and for the quality bench: the script of the letters, then, for
# Latin-script text, which language's most common function words it holds (no library: langdetect-style
# models are overkill and unreliable on the 5-15 word turns of a voice chat; this says what it knows).
_STOP_WORDS: dict[str, frozenset[str]] = {
    "en": frozenset("the a an is are was of to and in it you that what how why who for on with this do does i my your".split()),
    "fr": frozenset("le la les est des une et du au aux ce cette qui que pas sont avec dans sur il elle nous vous ils "
                    "mais quelle quel quoi comment où je tu mon ton lui cela ceci leur ne qu'on c'est n'est avait était "
                    "aussi être avoir fait peut".split()),
    "es": frozenset("el los las es y una del que por con para está son pero muy qué cómo dónde cuál yo tu mi".split()),
    "de": frozenset("der das ist und ein eine nicht mit von zu auf für wir ich du was wie wo warum ist sind".split()),
    "it": frozenset("il gli della è sono che di per non una come dove perché io tu mio".split()),
    "pt": frozenset("o os as ao é um uma do da que não com para em como onde porque eu você nossa nosso olá obrigado".split()),
    "nl": frozenset("de het een is en niet met van op voor wat hoe waar ik jij".split()),
}
# elisions English does not have (its apostrophes come later in a word: "it's", "I'm", "o'clock" is "o'")
_ELISION = re.compile(r"^(l|d|qu|c|n|j|s|dell|all|nell|sull|dall|un)'[a-zà-ÿ]")
_ITALIAN_ELISIONS = frozenset({"dell", "all", "nell", "sull", "dall", "un"})
_SCRIPT_LANG = {"CYRILLIC": "ru", "GREEK": "el", "CJK": "zh", "HIRAGANA": "ja", "KATAKANA": "ja", "HANGUL": "ko",
                "ARABIC": "ar", "HEBREW": "he", "DEVANAGARI": "hi"}


def guess_language(text: str) -> str | None:
    """ISO code of the likeliest language of ``text``, or ``None`` when it holds no letters/known words."""
    scripts: dict[str, int] = {}
    for c in text:
        if c.isalpha() and not c.isascii():
            name = unicodedata.name(c, "")
            for prefix, lang in _SCRIPT_LANG.items():
                if name.startswith(prefix):
                    scripts[lang] = scripts.get(lang, 0) + 1
    letters = sum(c.isalpha() for c in text)
    if scripts and max(scripts.values()) * 2 >= letters:
        return max(scripts, key=scripts.get)
    words = [w.strip(".,;:!?¿¡\"'()").lower().replace("\u2019", "'") for w in text.split()]
    hits = {lang: sum(w in stop for w in words) for lang, stop in _STOP_WORDS.items()}
    for w in words:  # an elided article or pronoun ("L'Alma", "d'avoir", "dell'arte") is French or Italian
        m = _ELISION.match(w)
        if m:
            hits["it" if m.group(1) in _ITALIAN_ELISIONS else "fr"] += 1
    best = max(hits, key=hits.get)
    if hits[best] == 0:
        return None
    return "en" if hits["en"] == hits[best] else best
