"""Feature-map (linearised) attention: ``linear``, ``efficient``, ``performer`` and ``rfa``. Shared pieces:
:mod:`.feature_map` (the maths), :mod:`.random_features` (random-feature base); the chunked autograd cores are
:mod:`vitzoo.ops.feature` and :mod:`vitzoo.ops.efficient`.
"""
