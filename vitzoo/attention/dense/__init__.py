"""Dense softmax attention: ``global`` (every token attends to every token) and ``window`` (Swin's
(shifted) windows, whose fused CPU core is :mod:`vitzoo.ops.window`).
"""
