"""KV memory: request rows, the paged allocator, the radix prefix cache, sessions."""
