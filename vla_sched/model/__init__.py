"""The VLA model by concern, each building on those before it:
config < prompting, layers < loading < runner.
"""
