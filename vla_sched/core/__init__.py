"""Scheduling and KV memory: pure Python with CPU torch index tensors; no ROS, no CUDA."""
