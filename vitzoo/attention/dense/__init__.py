"""Dense softmax attention: ``global`` (every token attends to every token) and ``window`` (Swin's
(shifted) windows, with its fused CPU core in :mod:`.window_core`).
"""
