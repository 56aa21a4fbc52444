"""Checkers for the exercises at the end of each chapter.

Each ``check_*`` function takes the reader's answer and returns a
:class:`~mha_lib.exercises.verdict.Verdict`, which prints as
``Correct: ...`` or ``Not yet: ...`` with a hint; ``bool(verdict)`` says
whether the answer is right. A checker compares with the library, so a
correct answer is one that agrees with ``mha_lib``. It tries the cases a
real model meets (strided tensors, training mode and gradients, several
shapes, empty rows), refuses what the exercise rules out, and never shows
the expected answer: a classic mistake is named, with the section of the
book that explains it (``"see 'Why divide by sqrt(d_k)' in chapter 6"``),
anything else is told how far off it is. One module per chapter
(``chapter01``, ``chapter02``, ...); every checker is also importable from
here, and so is ``SENTENCES``, the book's running example.

Usage, in a notebook::

    from mha_lib.exercises import check_attention
    print(check_attention(attention))   # Correct: ... or Not yet: ...
"""

from mha_lib.exercises.chapter01 import (
    check_bpe_merges,
    check_bpe_split,
    check_byte_ids,
    check_pad_scores,
    check_padded_batch,
    check_tokenizer,
    check_vocab,
)
from mha_lib.exercises.chapter02 import (
    check_embedding_parameters,
    check_onehot_embedding,
    check_padding_embedding,
)
from mha_lib.exercises.chapter03 import (
    check_ahead_matrix,
    check_shift_matrix,
    check_sinusoidal,
)
from mha_lib.exercises.chapter04 import (
    check_fused_projection,
    check_previous_token,
    check_projection,
    check_projection_parameters,
)
from mha_lib.exercises.chapter05 import (
    check_head_columns,
    check_merge_heads,
    check_split_heads,
)
from mha_lib.exercises.chapter06 import (
    check_attention,
    check_softmax_jacobian,
    check_temperature,
)
from mha_lib.exercises.chapter07 import (
    check_decoder_mask,
    check_padding_mask,
    check_prefix_lm_mask,
    check_safe_softmax,
)
from mha_lib.exercises.chapter08 import (
    check_concat_heads,
    check_masked_self_attention,
    check_mha_forward,
    check_num_parameters,
)
from mha_lib.exercises.chapter09 import (
    check_d2l_to_mha,
    check_repeat_lens,
    check_unfold_weights,
)
from mha_lib.exercises.chapter10 import (
    check_einops_mask,
    check_einsum_num_parameters,
    check_einsum_scores,
    check_split_qkv,
)
from mha_lib.exercises.chapter11 import (
    check_sdpa_attention,
    check_to_torch,
    check_torch_masks,
)
from mha_lib.exercises.chapter12 import (
    check_block_params,
    check_llama_block,
    check_llama_block_params,
    check_parallel_block,
    check_pre_norm,
)
from mha_lib.exercises.chapter13 import (
    check_masked_tiles,
    check_score_intensity,
    check_tiled_softmax,
    check_weights_mib,
)
from mha_lib.exercises.chapter14 import (
    check_cache_bytes,
    check_cache_capacity,
    check_cached_step,
    check_chunk_mask,
    check_expand_kv,
    check_shared_kv_attention,
)
from mha_lib.exercises.chapter15 import (
    check_answer_loss,
    check_copy_batch,
    check_find_induction_head,
    check_remove_head,
)
from mha_lib.exercises.chapter16 import (
    check_rotary_complex,
    check_rotate_half,
    check_unturned_pairs,
)
from mha_lib.exercises.chapter17 import (
    check_alibi_slopes,
    check_bidirectional_alibi,
    check_document_window_mod,
    check_reach_inputs,
    check_ring_held,
    check_softcap_score_mod,
)
from mha_lib.exercises.chapter18 import (
    check_absorbed_query,
    check_absorbed_scores,
    check_absorbed_step,
    check_decode_flops_per_byte,
    check_key_projection,
    check_latent_cache_bytes,
)
from mha_lib.exercises.verdict import SENTENCES, Verdict

__all__ = [
    "Verdict",
    "SENTENCES",
    "check_tokenizer",
    "check_vocab",
    "check_padded_batch",
    "check_bpe_merges",
    "check_bpe_split",
    "check_pad_scores",
    "check_byte_ids",
    "check_onehot_embedding",
    "check_padding_embedding",
    "check_embedding_parameters",
    "check_sinusoidal",
    "check_shift_matrix",
    "check_ahead_matrix",
    "check_projection",
    "check_fused_projection",
    "check_projection_parameters",
    "check_previous_token",
    "check_split_heads",
    "check_merge_heads",
    "check_head_columns",
    "check_attention",
    "check_temperature",
    "check_softmax_jacobian",
    "check_padding_mask",
    "check_decoder_mask",
    "check_safe_softmax",
    "check_prefix_lm_mask",
    "check_concat_heads",
    "check_masked_self_attention",
    "check_num_parameters",
    "check_mha_forward",
    "check_repeat_lens",
    "check_unfold_weights",
    "check_d2l_to_mha",
    "check_einsum_scores",
    "check_einops_mask",
    "check_einsum_num_parameters",
    "check_split_qkv",
    "check_to_torch",
    "check_torch_masks",
    "check_sdpa_attention",
    "check_block_params",
    "check_pre_norm",
    "check_llama_block",
    "check_parallel_block",
    "check_llama_block_params",
    "check_score_intensity",
    "check_weights_mib",
    "check_tiled_softmax",
    "check_masked_tiles",
    "check_cache_bytes",
    "check_cache_capacity",
    "check_expand_kv",
    "check_chunk_mask",
    "check_cached_step",
    "check_shared_kv_attention",
    "check_copy_batch",
    "check_answer_loss",
    "check_remove_head",
    "check_rotate_half",
    "check_rotary_complex",
    "check_unturned_pairs",
    "check_document_window_mod",
    "check_alibi_slopes",
    "check_bidirectional_alibi",
    "check_softcap_score_mod",
    "check_ring_held",
    "check_reach_inputs",
    "check_absorbed_query",
    "check_latent_cache_bytes",
    "check_key_projection",
    "check_absorbed_scores",
    "check_decode_flops_per_byte",
    "check_absorbed_step",
    "check_find_induction_head",
]
