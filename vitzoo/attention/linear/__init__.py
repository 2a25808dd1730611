"""Feature-map (linearised) attention: ``linear``, ``efficient``, ``performer`` and ``rfa``. Shared pieces:
:mod:`.feature_map` (the maths), :mod:`.random_features` (random-feature base), :mod:`.feature_core` and
:mod:`.efficient_core` (chunked autograd cores).
"""
