"""Sampling controls: each one batched equals one-at-a-time for the same seed (on the sampler and through the
real engine with a tiny random-init model), each one does what it says, and language steering."""

from __future__ import annotations

import collections

import pytest
import torch

from omni_rt.engine.weights import loader as weights
from omni_rt.engine.factory import create_ar_scheduler
from omni_rt.engine.prompt.language import steer_messages, vocab_mask
from omni_rt.engine.prompt.request import SamplingParams, parse_request
from omni_rt.engine.builtin.sampling import SlotSampler, copy_end_ban, no_repeat_ngram_ban
from tiny_models import build_tiny_model
from omni_rt.testing.stage_driver import collect, send

V = 64

CONTROLS = {
    "repetition_penalty": SamplingParams(repetition_penalty=1.5),
    "frequency_penalty": SamplingParams(frequency_penalty=0.8),
    "presence_penalty": SamplingParams(presence_penalty=1.2),
    "no_repeat_ngram_size": SamplingParams(no_repeat_ngram_size=3),
    "temperature": SamplingParams(temperature=1.0, seed=11),
    "top_k": SamplingParams(temperature=1.0, top_k=5, seed=12),
    "top_p": SamplingParams(temperature=1.0, top_p=0.5, seed=13),
    "min_p": SamplingParams(temperature=1.0, min_p=0.2, seed=14),
    "everything": SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.05, repetition_penalty=1.2,
                                 frequency_penalty=0.3, presence_penalty=0.3, no_repeat_ngram_size=2, seed=15),
}


def row_logits(row: int, step: int) -> torch.Tensor:
    """Deterministic logits for one row at one step: peaked enough that greedy would loop on a few tokens."""
    g = torch.Generator().manual_seed(1000 * row + step % 3)
    return torch.randn(V, generator=g) * 3.0


def run_rows(rows: list[tuple[int, SamplingParams]], steps: int, slots: int = 8) -> list[list[int]]:
    """Decode ``rows`` together in one sampler (slots 0..n-1), like the engine's batched step."""
    s = SlotSampler(slots, V, 128, torch.device("cpu"))
    for slot, (_, p) in enumerate(rows):
        s.assign(slot, p)
    out: list[list[int]] = [[] for _ in rows]
    for step in range(steps):
        logits = torch.stack([row_logits(r, step) for r, _ in rows])
        tok = s.select(logits, slice(0, len(rows))).tolist()
        for i, t in enumerate(tok):
            out[i].append(t)
    return out


def max_ngram_count(tokens: list[int], n: int) -> int:
    c = collections.Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return max(c.values(), default=0)


@pytest.mark.parametrize("control", sorted(CONTROLS))
def test_batched_equals_one_at_a_time(control):
    """The row under test shares its batch with a greedy row and two other sampled rows."""
    p = CONTROLS[control]
    batch = [(0, p), (1, SamplingParams()), (2, SamplingParams(temperature=1.2, seed=99)), (3, CONTROLS["everything"])]
    together = run_rows(batch, steps=40)
    for (row, params), toks in zip(batch, together):
        assert run_rows([(row, params)], steps=40)[0] == toks, f"row {row} ({control}) differs when batched"


def test_each_control_changes_greedy():
    greedy = run_rows([(0, SamplingParams())], 40)[0]
    assert max_ngram_count(greedy, 4) >= 3, "the synthetic logits should make plain greedy loop"
    for name, p in CONTROLS.items():
        assert run_rows([(0, p)], 40)[0] != greedy, f"{name} had no effect"


def test_no_repeat_ngram_never_repeats():
    for n in (1, 2, 3, 4):
        toks = run_rows([(0, SamplingParams(no_repeat_ngram_size=n))], 40)[0]
        if n == 1:
            assert len(set(toks)) == len(toks)
        else:
            assert max_ngram_count(toks, n) == 1, (n, toks)


def test_no_repeat_ngram_ban_unit():
    hist = torch.tensor([[5, 6, 7, 5, 6, -1], [1, 1, 1, -1, -1, -1]])
    ban = no_repeat_ngram_ban(hist, torch.tensor([5, 3]), torch.tensor([3, 2]), 10)
    assert ban[0].nonzero().flatten().tolist() == [7]  # "5 6" was followed by 7
    assert ban[1].nonzero().flatten().tolist() == [1]  # "1" was followed by 1
    assert not no_repeat_ngram_ban(hist, torch.tensor([5, 3]), torch.tensor([0, 0]), 10).any()


def test_copy_end_ban_unit():
    """A row is held open exactly when its generated tokens are one of its earlier answers, whole."""
    copies = torch.tensor([[[5, 6, 7, -1], [5, 6, -1, -1]], [[1, 2, 3, 4], [-1, -1, -1, -1]]])
    lens = torch.tensor([[3, 2], [4, 0]])
    hist = torch.tensor([[5, 6, 7, -1, -1], [1, 2, 3, -1, -1]])
    assert copy_end_ban(hist, torch.tensor([3, 3]), copies, lens).tolist() == [True, False]  # row 1: 3 of 4 tokens
    assert copy_end_ban(hist, torch.tensor([2, 4]), copies, lens).tolist() == [True, False]  # "5 6" is a copy too
    assert copy_end_ban(hist[:, :2], torch.tensor([3, 3]), copies, lens).tolist() == [False, False]  # narrower hist


def test_an_answer_that_is_an_earlier_one_may_not_end_there():
    """Greedy logits that would end (token 0) right after the tokens of an earlier answer: the row carrying that
    answer as a copy goes on instead; a row without it ends; a batch does not mix them up."""
    ending = torch.zeros(V, dtype=torch.bool)
    ending[0] = True
    script = [7, 8, 9, 0]  # the answer the logits dictate, then the end token

    def logits(step: int) -> torch.Tensor:
        x = torch.zeros(V)
        x[script[min(step, 3)]] = 5.0
        x[11] = 4.0  # the second best: what a held-open answer says instead of ending
        return x

    s = SlotSampler(2, V, 32, torch.device("cpu"))
    s.ending = ending
    s.assign(0, SamplingParams(copies=((7, 8, 9),)))
    s.assign(1, SamplingParams(copies=((7, 8, 4),)))  # another earlier answer: not this one
    got = [s.select(torch.stack([logits(step)] * 2), slice(0, 2)).tolist() for step in range(4)]
    assert [g[0] for g in got] == [7, 8, 9, 11] and [g[1] for g in got] == [7, 8, 9, 0]
    s.release(0)
    s.move(1, 0)  # compaction carries the copies with the slot
    assert int(s.copy_len[0, 0]) == 3 and int(s.copy_len[1, 0]) == 0


def test_copy_prefixes_of_a_real_tokenizer():
    """Earlier answers become token ids without their ending; short ones and non-answers are left out."""
    from omni_rt.engine.builtin.copy_ban import copy_prefixes, ending_tokens

    tok = weights.load_tokenizer(weights.resolve_model("smollm2"))
    ending = ending_tokens(tok, len(tok), [tok.eos_token_id])
    assert ending[tok.encode(".", add_special_tokens=False)[0]] and ending[tok.eos_token_id]
    assert not ending[tok.encode(" Paris", add_special_tokens=False)[0]]
    msgs = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "The capital is Paris."},
            {"role": "assistant", "content": "Yes."}, {"role": "assistant", "content": [{"type": "text"}]}]
    (only,) = copy_prefixes(tok, msgs, ending)
    assert tok.decode(list(only)) == "The capital is Paris"


def test_repetition_penalty_breaks_a_fixed_point():
    s = SlotSampler(2, 4, 16, torch.device("cpu"))
    s.assign(0, SamplingParams())
    s.assign(1, SamplingParams(repetition_penalty=1.5))
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0]] * 2)
    seq = [s.select(logits, slice(0, 2)).tolist() for _ in range(3)]
    assert [r[0] for r in seq] == [0, 0, 0]
    assert [r[1] for r in seq] == [0, 1, 0]  # 5/1.5 < 4; then 3.33 > 4/1.5 (HF semantics: not cumulative)


def test_frequency_and_presence_penalties_subtract():
    s = SlotSampler(2, 3, 16, torch.device("cpu"))
    s.assign(0, SamplingParams(frequency_penalty=1.0))
    s.assign(1, SamplingParams(presence_penalty=1.6))
    logits = torch.tensor([[3.0, 1.5, 0.0]] * 2)
    seq = [s.select(logits, slice(0, 2)).tolist() for _ in range(4)]
    assert [r[0] for r in seq] == [0, 0, 1, 0]  # token 0: 3 -> 2 -> 1 (< 1.5); then token 1 drops to 0.5
    assert [r[1] for r in seq] == [0, 1, 0, 0]  # presence: once seen, 3 - 1.6 and 1.5 - 1.6, not cumulative


def test_filters_reduce_to_greedy_and_sampling_spreads():
    greedy = run_rows([(0, SamplingParams())], 30)[0]
    for p in (SamplingParams(temperature=2.0, top_k=1, seed=3), SamplingParams(temperature=2.0, top_p=1e-6, seed=3),
              SamplingParams(temperature=2.0, min_p=1.0, seed=3)):
        assert run_rows([(0, p)], 30)[0] == greedy, p
    # flat logits at temperature 1: counter-based Gumbel noise spreads picks evenly over the vocabulary
    s = SlotSampler(1, 4, 512, torch.device("cpu"))
    s.assign(0, SamplingParams(temperature=1.0, seed=5))
    picks = collections.Counter(int(s.select(torch.zeros(1, 4), slice(0, 1))) for _ in range(400))
    assert all(60 <= picks[t] <= 140 for t in range(4)), picks
    s.assign(0, SamplingParams(temperature=1.0, top_k=2, seed=5))
    assert set(int(s.select(torch.tensor([[0.0, 3.0, 2.9, -1.0]]), slice(0, 1))) for _ in range(50)) == {1, 2}


def test_compaction_moves_the_history():
    """A row moved to another slot (the scheduler's compaction) continues exactly as if it had not moved."""
    p = SamplingParams(temperature=0.9, repetition_penalty=1.3, no_repeat_ngram_size=2, seed=21)
    ref = run_rows([(4, p)], 20)[0]
    s = SlotSampler(4, V, 128, torch.device("cpu"))
    s.assign(0, SamplingParams())
    s.assign(3, p)
    got = []
    for step in range(20):
        if step == 10:
            s.release(0)
            s.move(3, 0)
        slot = 3 if step < 10 else 0
        got.append(int(s.select(row_logits(4, step)[None], torch.tensor([slot]))))
    assert got == ref


def test_request_sampling_keys_and_preset_defaults():
    req = parse_request({"prompt_ids": [1], "repetition_penalty": 1.2}, 8, {"repetition_penalty": 1.1, "min_p": 0.1})
    assert req.sampling.repetition_penalty == 1.2 and req.sampling.min_p == 0.1
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        parse_request({"prompt_ids": [1], "no_repeat_ngram_size": -1}, 8)
    with pytest.raises(ValueError, match="repetition_penalty"):
        parse_request({"prompt_ids": [1], "repetition_penalty": "high"}, 8)


# ---------------------------------------------------------------- through the real engine
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return build_tiny_model("llama", tmp_path_factory.mktemp("tiny-sampling") / "llama")


def test_engine_batched_equals_one_at_a_time(tiny_llama):
    """Seeded requests with every control give the same tokens alone and in a batch of four (with lookahead)."""
    sched = create_ar_scheduler(str(tiny_llama), max_batch_size=4)
    sched.start()
    try:
        base = {"max_tokens": 16, "ignore_eos": True}
        reqs = {
            "rep": {"prompt_ids": [3, 4, 5], "repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
            "hot": {"prompt_ids": [7, 8], "temperature": 1.0, "top_p": 0.9, "min_p": 0.05, "seed": 4},
            "pen": {"prompt_ids": [9, 9, 9, 9], "temperature": 0.7, "top_k": 8, "frequency_penalty": 0.5,
                    "presence_penalty": 0.5, "seed": 5},
            "greedy": {"prompt_ids": [11, 12, 13]},
        }
        alone = {}
        for rid, r in reqs.items():
            send(sched, rid, {**base, **r})
            alone[rid] = collect(sched, [rid])[rid]["result"]["token_ids"]
        for rid, r in reqs.items():
            send(sched, rid + "-b", {**base, **r})
        together = collect(sched, [rid + "-b" for rid in reqs])
        for rid in reqs:
            assert together[rid + "-b"]["result"]["token_ids"] == alone[rid], rid
        assert max_ngram_count(alone["rep"], 2) == 1
    finally:
        sched.stop()


# ---------------------------------------------------------------- language steering
@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return weights.load_tokenizer(weights.ensure_smollm2())


def test_english_vocab_mask_bans_other_scripts(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ban = vocab_mask(tok, ("en",), len(tok))
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert not any(ban[i] for i in ids(" The capital of France is Paris, 42 km away."))
    assert all(not ban[i] for i in tok.all_special_ids)  # EOS stays available
    for foreign in ("é", "ü", "д", "中", "α"):
        assert any(ban[i] for i in ids(foreign)), foreign
    fr = vocab_mask(tok, ("fr",), len(tok))
    assert not any(fr[i] for i in ids(" Le café est très bon")) and any(fr[i] for i in ids("中"))


def test_steer_messages_appends_to_the_system_prompt():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hola"}]
    out = steer_messages(msgs, ("en",))
    assert out[0]["content"].startswith("Be brief. Always reply in English") and out[1] == msgs[1]
    assert msgs[0]["content"] == "Be brief."  # the caller's list is not changed
    assert steer_messages([{"role": "user", "content": "Hi"}], ("en", "fr"))[0]["content"].startswith(
        "Always reply in English or French")
    # a turn in a language the voice cannot speak primes an answer in its first language; English ones stay
    chat = [{"role": "user", "content": "Quelle est la capitale de la France ?"}, {"role": "user", "content": "Why?"}]
    out = steer_messages(chat, ("en",))
    assert out[1]["content"] == "Question (not in English): Quelle est la capitale de la France ?\nEnglish answer:"
    assert out[2] == chat[1]
