"""OpenVLA and LLaVA-layout checkpoints: action tokens decoded one per pass (``family.py``)."""
