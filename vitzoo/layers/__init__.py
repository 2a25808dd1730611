"""Building blocks shared by the backbones: the transformer block and the analytic costs of plain layers."""
