"""Model families, one folder each, behind one protocol (``protocol.py``); ``registry.py``
picks a folder's family. A family builds on the shared concerns below it (config < layers <
loading < runner) and holds what only it knows: reading its folder and settings, its
prompt and request inputs, its model assembly, its runner or passes, how its outputs
become an action chunk and what a step takes and returns. See docs/adding_a_model.md.
"""
