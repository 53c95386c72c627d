"""autotune: tune the system knobs of an unmodified PyTorch training script by measuring it."""

__version__ = "0.1.0"
