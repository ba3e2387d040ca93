"""Neural-network layers on paged KV: attention, RoPE, the decoder, the vision towers, sampling."""
