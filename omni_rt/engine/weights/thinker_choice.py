"""``omni-rt serve --thinker MODEL``: a local GGUF file or an OpenAI-compatible server as the thinker, one flag.

The model is checked before anything loads, so a wrong choice fails at start-up with one line that says what
is wrong (``ThinkerError``), not a traceback from deep inside a stage:

- a ``.gguf`` path: the file exists, is a GGUF (magic bytes), and its metadata holds a chat template
  (``tokenizer.chat_template``: without one the thinker cannot tell instructions from the user's words). It runs
  on llama.cpp like the packaged one (PyTorch fallback when ``llama-server`` is not built); its tokenizer, chat
  template, stop token and tool format are read from the GGUF itself (``loader.load_tokenizer``), so nothing
  SmolLM2-specific applies to it.
- ``OWNER/REPO`` or ``OWNER/REPO:FILE.gguf``: a Hugging Face repo's GGUF, downloaded once into the Hugging Face
  cache (its own progress bar) and then checked as a local file. The one download in omni-rt, and only because
  the operator named it: a cached copy is used without the network; when the network or ``HF_HUB_OFFLINE=1``
  forbids the download, the error says so. A repo with several GGUFs needs ``:FILE`` unless one is Q4_K_M.
- ``http(s)://HOST:PORT/v1``: an OpenAI-compatible server (SGLang, vLLM, llama.cpp, Ollama, omni-rt's own).
  ``GET /models`` must answer; its first model is the one asked for. The upstream applies its own template.

Only the response stage's model arguments change; the preset's sampling, answer policy and languages stay.
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
HUB_SPEC = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?::(?P<file>[^\s:]+\.gguf))?$")
PREFERRED_QUANT = "q4_k_m"  # what most GGUF repos call their default; picked when a repo holds several files


class ThinkerError(ValueError):
    """A ``--thinker`` choice that cannot work; the message is one line for the operator."""


@functools.lru_cache(maxsize=8)
def thinker_args(spec: str, api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, Any]:
    """The response stage's argument overrides for ``spec`` (cached: the CLI checks, the runtime applies)."""
    spec = spec.strip()
    if spec.startswith(("http://", "https://")):
        return _remote(spec, api_key, timeout_s)
    if is_hub_spec(spec):
        return _gguf(str(hub_gguf(spec)), shown=spec)
    return _gguf(spec)


def is_hub_spec(spec: str) -> bool:
    """``OWNER/REPO`` or ``OWNER/REPO:FILE.gguf`` that is not a path on this machine."""
    m = HUB_SPEC.match(spec)
    if m is None or Path(spec).expanduser().exists():
        return False
    return m["file"] is not None or not spec.endswith(".gguf")


def _pick_gguf(spec: str, names: list[str]) -> str:
    ggufs = sorted(n for n in names if n.endswith(".gguf"))
    if not ggufs:
        raise ThinkerError(f"--thinker {spec}: the repo holds no .gguf file")
    if len(ggufs) == 1:
        return ggufs[0]
    preferred = [n for n in ggufs if PREFERRED_QUANT in n.lower()]
    if len(preferred) == 1:
        return preferred[0]
    shown = ", ".join(ggufs[:6]) + (" ..." if len(ggufs) > 6 else "")
    raise ThinkerError(f"--thinker {spec}: the repo holds {len(ggufs)} GGUF files ({shown}); name one as {spec}:FILE.gguf")


def hub_gguf(spec: str) -> Path:
    """The local path of a hub repo's GGUF: from the Hugging Face cache if it is there, else downloaded once.

    Why the offline switch is lifted here: ``omni-rt serve`` sets ``HF_HUB_OFFLINE=1`` by default so that no
    stage reaches a hub behind the operator's back; naming a repo is asking for this one download. An
    ``HF_HUB_OFFLINE=1`` the operator set (``OMNI_RT_ALLOW_THINKER_DOWNLOAD=0``, which the CLI sets then) is kept."""
    import os

    from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

    m = HUB_SPEC.match(spec)
    assert m is not None
    repo, wanted = m["repo"], m["file"]
    try:  # the cache first: no network needed for a model fetched before
        folder = Path(snapshot_download(repo, allow_patterns=[wanted or "*.gguf"], local_files_only=True))
        cached = [p.name for p in folder.glob("*.gguf")]
        if cached:
            return folder / (wanted if wanted else _pick_gguf(spec, cached))
    except Exception:  # not cached (huggingface_hub raises one of several errors here)
        pass
    if os.environ.get("OMNI_RT_ALLOW_THINKER_DOWNLOAD", "1") == "0":
        raise ThinkerError(f"--thinker {spec}: not in the Hugging Face cache, and downloads are off (HF_HUB_OFFLINE=1); "
                           "download the .gguf elsewhere and pass its path")
    saved, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, False
    try:
        name = wanted or _pick_gguf(spec, HfApi().list_repo_files(repo))
        log.info("--thinker %s: downloading %s into the Hugging Face cache (once)", spec, name)
        return Path(hf_hub_download(repo, name))
    except ThinkerError:
        raise
    except Exception as exc:  # offline, DNS, 404, gated repo: one line, the class says which
        raise ThinkerError(f"--thinker {spec}: cannot download it from the Hugging Face hub ({type(exc).__name__}); "
                           "check the repo id and the network, or pass a local .gguf path") from None
    finally:
        constants.HF_HUB_OFFLINE = saved


def apply_thinker(config: Any, spec: str, api_key: str | None = None) -> str:
    """Point ``config``'s response stage at ``spec``; returns the stage's name."""
    name = config.roles.response or config.entry
    args = config.stage(name).args
    overrides = thinker_args(spec, api_key)
    for key in ("backend", "model", "tokenizer", "base_url", "api_key"):
        args.pop(key, None)
    args.update(overrides)
    return name


def gguf_chat_template(path: Path) -> str | None:
    """``tokenizer.chat_template`` from a GGUF's metadata (``None`` when absent)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return None if field is None else str(field.contents())


def _gguf(spec: str, shown: str | None = None) -> dict[str, Any]:
    path = Path(spec).expanduser()
    where = f"--thinker {shown or spec}"
    if not path.exists():
        hint = "" if spec.endswith(".gguf") else " (a .gguf file, or an http(s)://HOST:PORT/v1 URL)"
        raise ThinkerError(f"{where}: no such file{hint}")
    if path.is_dir():
        raise ThinkerError(f"{where}: is a directory; give the .gguf file inside it")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ThinkerError(f"{where}: cannot read it ({exc.strerror})") from None
    if magic != GGUF_MAGIC:
        raise ThinkerError(f"{where}: not a GGUF file (it does not start with the GGUF magic bytes)")
    try:
        template = gguf_chat_template(path)
    except Exception as exc:  # a truncated or corrupt file: gguf raises from deep inside its parser
        raise ThinkerError(f"{where}: unreadable GGUF metadata ({type(exc).__name__}: {exc})") from None
    if not template or not template.strip():
        raise ThinkerError(f"{where}: the model has no chat template (no tokenizer.chat_template in its GGUF "
                           "metadata); use the GGUF of an instruct/chat model")
    if "tools" not in template:  # what the model cannot do is said at start-up (tool_prompt.detect_format's test)
        log.info("%s: its chat template renders no tools; function tools go through omni-rt's own tool prompt "
                 "(Hermes-style <tool_call> blocks), as for SmolLM2", where)
    resolved = str(path.resolve())
    return {"backend": "llama.cpp", "model": resolved, "tokenizer": resolved}


def _remote(url: str, api_key: str | None, timeout_s: float) -> dict[str, Any]:
    import httpx

    base = url.rstrip("/")
    where = f"--thinker {url}"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(base + "/models", headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ThinkerError(f"{where}: cannot reach it ({type(exc).__name__}); is the OpenAI-compatible server "
                           "running, and does the URL end in /v1?") from None
    if r.status_code in (401, 403):
        raise ThinkerError(f"{where}: refused our API key (HTTP {r.status_code}); set OMNI_RT_THINKER_API_KEY")
    if r.status_code != 200:
        raise ThinkerError(f"{where}: GET /models answered HTTP {r.status_code}; is this an OpenAI-compatible "
                           "/v1 URL?")
    try:
        ids = [m["id"] for m in r.json().get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except ValueError:
        ids = None
    if ids is None:
        raise ThinkerError(f"{where}: GET /models did not answer JSON; is this an OpenAI-compatible /v1 URL?")
    if not ids:
        raise ThinkerError(f"{where}: the server lists no model under /models")
    out: dict[str, Any] = {"backend": "remote", "base_url": base, "model": ids[0]}
    if api_key:
        out["api_key"] = api_key
    return out
