"""SmolVLA: a SmolVLM2 prefix on the paged KV and a flow-matching expert that alternates joint
self-attention and cross-attention to the prefix."""
