"""The VLA model on paged KV: decoder, vision tower, action tokens, loading, model runner."""
