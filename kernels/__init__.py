"""Triton kernels for paged KV attention, each beside its float32 torch reference.

Installed and imported as ``vla_sched.kernels``. Per decoder layer the KV cache is
``k_cache [num_slots, num_kv_heads, head_dim]`` and ``v_cache [num_slots, num_kv_heads,
v_head_dim]``; requests find their slots through the engine's slot table ``req_to_token``.

Modules, each with a Triton launcher, a torch reference and a dispatcher:
- ``store_kv``: ``store_kv`` / ``store_kv_ref`` / ``run_store_kv``.
- ``decode_attention``: split-K ``decode_attention`` / ``decode_attention_ref`` /
  ``run_decode_attention``, plus ``choose_num_kv_splits``.
- ``extend_attention``: ``extend_attention`` / ``extend_attention_ref`` /
  ``run_extend_attention`` (causal, optionally bidirectional inside an image span).

The dispatchers run Triton on CUDA and the reference elsewhere unless ``backend`` says
otherwise. Triton itself is imported on the first launch only, so the references work
without it, and on a CPU ``TRITON_INTERPRET=1`` has to be set before that first launch.
Value checks (slot ranges, lengths) run in the launchers when ``debug=True`` or the
``VLA_SCHED_KERNEL_DEBUG`` environment variable is set; the references always run them.
"""
