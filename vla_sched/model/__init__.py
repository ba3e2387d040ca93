"""The VLA model: shared concerns, each building on those before it (config < layers <
loading < runner), and the model families on top of them (``families/``).
"""
