"""Loading: tensor names, safetensors files, the assembled VLAModel, the built-in tiny model."""
