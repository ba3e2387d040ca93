"""Paged KV attention and the decoder's fused steps in two backends: 'triton' (the kernels)
and 'torch' (torch ops).

Installed and imported as ``vla_sched.kernels``. Per decoder layer the KV cache is
``k_cache [num_slots, num_kv_heads, head_dim]`` and ``v_cache [num_slots, num_kv_heads,
v_head_dim]``; requests find their slots through the engine's slot table ``req_to_token``.

Modules, each with a Triton launcher, its torch-backend twin and a dispatcher:
- ``store_kv``: ``store_kv`` / ``store_kv_torch`` / ``run_store_kv``.
- ``decode_attention``: split-K ``decode_attention`` / ``decode_attention_torch`` /
  ``run_decode_attention``, plus ``choose_num_kv_splits``.
- ``extend_attention``: ``extend_attention`` / ``extend_attention_torch`` /
  ``run_extend_attention`` (causal, optionally bidirectional inside an image span).
- ``rms_norm``: ``rms_norm`` / ``rms_norm_torch`` / ``run_rms_norm``, and with the residual
  add before it ``fused_add_rms_norm`` / ``fused_add_rms_norm_torch`` /
  ``run_fused_add_rms_norm`` (returns the normed rows and the new residual).
- ``activation``: ``silu_and_mul`` / ``silu_and_mul_torch`` / ``run_silu_and_mul`` over a
  merged gate/up projection.
- ``rotary``: ``rotary_embedding`` / ``rotary_embedding_torch`` / ``run_rotary_embedding``,
  queries and keys rotated together in place from the step's cos/sin tables.

The decoder kernels keep transformers' rounding order (float32 inside, each torch op's
result rounded to the activation dtype), so their torch twins compute what the separate
torch ops did.

The 'torch' backend is the production path off CUDA (the model's CPU attention) and the
reference the Triton kernels are tested against. Its plans are worked out once per step and
its arithmetic runs per layer: ``decode_reads`` (the slots a decode step reads) and
``extend_runs`` (an extend step's requests grouped by shape) hold both.

The dispatchers (``run_*``, ``backend='auto'``) pick 'triton' on CUDA and 'torch'
elsewhere. Triton itself is imported on the first launch only, so the 'torch' backend works
without it, and on a CPU ``TRITON_INTERPRET=1`` has to be set before that first launch.
Value checks (slot ranges, lengths) run in the launchers when ``debug=True`` or the
``VLA_SCHED_KERNEL_DEBUG`` environment variable is set; the 'torch' backend runs them
unless its caller checked them (``check_values=False``).
"""
