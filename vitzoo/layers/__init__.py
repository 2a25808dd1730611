"""Building blocks shared by the backbones: the transformer block."""
