"""OpenVLA-OFT checkpoints: one bidirectional pass per step, the chunk from an L1 head
(``family.py``)."""
