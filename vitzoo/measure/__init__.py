"""Leaf measuring tools (no training, no benchmark applications): step timing (``timing``), the peak memory of a
phase (``memory``), the machine a measurement ran on (``environment``), what a forward pass keeps for backward
(``activations``), a training step's predicted memory from the model's ``memory()`` (``predicted``) and the
resident size of the CPU kernel caches its distinct matmul shapes fill (``kernel_cache``).

Every module here depends on torch (``environment`` also reads timm's version) and the standard library alone;
training, the benchmark applications (:mod:`vitzoo.bench`), scripts and tests import them, never the other way.
"""
