"""Token mixing without query-key attention: ``synthesizer``, ``fnet``, ``gmlp`` and ``mixer``; the
shared token-axis handling is in :mod:`.token_axis`.
"""
