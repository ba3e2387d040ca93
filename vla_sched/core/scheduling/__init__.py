"""The scheduler and its parts: requests, batches, passes, policies, loops, metrics."""
