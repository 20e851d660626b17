"""Models: captioners (Qwen3-VL), image embedders, text encoders and ``models.yaml``."""
