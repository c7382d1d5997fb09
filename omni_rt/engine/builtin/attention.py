"""Packed-GQA attention: grouped-query attention with a mask, without copying K/V to every query head.

Why: transformers' stock ``sdpa`` attention, given a mask (which the slot KV cache always passes, to hide each
row's unused tail), copies K and V to all query heads with ``repeat_kv`` before SDPA, in every layer of every
step, on the GPU machine's transformers 5.17 (``use_gqa_in_sdpa`` allows ``enable_gqa`` only when
``attention_mask is None``). 5.24 packs the query for ``q_len == 1`` (``pack_gqa``) but still repeats K/V for
prefill chunks. ``enable_gqa=True`` with a mask is not a way out on CUDA: SDPA then takes the math kernel,
which expands K/V itself. So this function views the query as ``[B, kv_heads, groups * q_len, D]``: every
query head of a group attends to its shared K/V head, read once, as extra query rows of one SDPA call; the
mask is broadcast (decode) or repeated per group (prefill: ``groups * q_len * L`` booleans, far fewer bytes
than the ``2 * heads * L * D`` K/V copy it replaces). The math is unchanged, so outputs equal the stock path
to rounding.

Registered in transformers' ``AttentionInterface`` under ``PACKED_GQA`` and selected with
``model.set_attn_implementation`` (both exist in 5.17 and 5.24); ``"sdpa"`` stays selectable. A call this
function does not handle (no mask, no groups, attention sinks or soft-capping) goes to the stock function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PACKED_GQA = "omni_packed_gqa"


def packed_gqa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``query`` [B, H, q, D], ``key``/``value`` [B, KVH, L, D], ``attention_mask`` [B or 1, 1, q, L] (bool:
    True = attend, or additive float) -> ``([B, q, H, D], None)``, the stock attention function's layout."""
    groups = getattr(module, "num_key_value_groups", 1)
    plain = (
        attention_mask is None
        or groups == 1
        or attention_mask.dim() != 4
        or attention_mask.shape[1] != 1
        or kwargs.get("s_aux") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("position_bias") is not None
    )
    if plain:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    b, heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    # query heads h = j * groups + g use K/V head j (repeat_kv's order), so this is a view, not a copy
    q = query.reshape(b, kv_heads, groups * q_len, dim)
    mask = attention_mask
    if q_len > 1:  # packed row g * q_len + t is query position t: the mask's rows repeat per group
        mask = mask[:, :, None].expand(mask.shape[0], 1, groups, q_len, mask.shape[-1])
        mask = mask.reshape(mask.shape[0], 1, groups * q_len, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    out = out.reshape(b, heads, q_len, value.shape[-1])
    return out.transpose(1, 2).contiguous(), None


SDPA_FAMILY = {"sdpa", PACKED_GQA}  # implementations taking SDPA's boolean masks (``register`` adds to it)


def register(name: str = PACKED_GQA, fn=packed_gqa_attention) -> str:
    """Make ``name`` a valid ``attn_implementation`` running ``fn`` (idempotent); returns the name. Its masks
    are built as for ``sdpa`` (same boolean layout): without a registered mask function transformers would
    drop a 2D padding mask for an unknown implementation (``_preprocess_mask_arguments``' early exit), which
    matters to anyone calling the switched model the ordinary way (``generate`` on a padded batch)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    SDPA_FAMILY.add(name)
    return name


def switch_attention(model: torch.nn.Module, name: str = PACKED_GQA, fn=None) -> bool:
    """Switch a loaded transformers model on SDPA (or on one of our SDPA-mask implementations) to ``name``:
    ``"sdpa"``, or ``fn`` registered as ``name`` (default: packed GQA). False, model unchanged, when it
    cannot be switched (not built on ``AttentionInterface``, or on another attention to begin with)."""
    if getattr(model.config, "_attn_implementation", None) not in SDPA_FAMILY or not hasattr(
        model, "set_attn_implementation"
    ):
        return False
    if name != "sdpa":
        register(name, fn or packed_gqa_attention)
    try:
        model.set_attn_implementation(name)
    except (ValueError, KeyError):  # a model class that refuses custom attention keeps its own
        return False
    return getattr(model.config, "_attn_implementation", None) == name
