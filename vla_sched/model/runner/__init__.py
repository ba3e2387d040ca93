"""The model runner: a ForwardBatch in, tokens out; its padded paths and captured CUDA graphs."""
