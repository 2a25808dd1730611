"""Building blocks shared by the backbones: window partitioning, the transformer block."""
