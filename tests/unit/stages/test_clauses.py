"""Clause cutting for the talker: short first clause, growing later ones, punctuation, markup."""

from omni_rt.stages.talker.clause_splitter import ClauseSplitter, clean_for_speech


def split(text: str, **kw) -> list[str]:
    sp = ClauseSplitter(**kw)
    out: list[str] = []
    for i, word in enumerate(text.split(" ")):
        out += sp.push(("" if i == 0 else " ") + word)  # LLM-style deltas: " word"
    return out + sp.flush()


def test_first_clause_is_short_then_clauses_grow():
    words = " ".join(f"w{i}" for i in range(60))
    clauses = split(words, first_max_words=4, max_words=24)
    sizes = [len(c.split()) for c in clauses]
    assert sizes[:4] == [4, 8, 16, 24]
    assert sum(sizes) == 60


def test_sentence_punctuation_and_soft_breaks():
    clauses = split("The capital of France is Paris. It is known for the Eiffel Tower, the Louvre, and cafes!")
    assert clauses[0] == "The capital of France"
    assert clauses[1] == "is Paris."
    assert "".join(clauses).replace(" ", "") == "ThecapitalofFranceisParis.ItisknownfortheEiffelTower,theLouvre,andcafes!"


def test_a_word_is_never_split_and_abbreviations_wait_for_whitespace():
    sp = ClauseSplitter()
    assert sp.push("Par") == [] and sp.push("is") == []
    assert sp.push(" is") == []  # "Paris" complete, still below the first clause's 4 words
    assert sp.flush() == ["Paris is"]
    assert split("Pi is 3.14 exactly.") == ["Pi is 3.14 exactly."]


def test_markup_is_not_spoken_and_empty_tails_are_dropped():
    assert clean_for_speech("**Bold** `code` # title 😀") == "Bold code  title "
    sp = ClauseSplitter()
    sp.push("...")
    assert sp.flush() == []
