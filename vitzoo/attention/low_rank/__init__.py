"""Low-rank attention: ``linformer`` (projected keys/values), ``nystrom`` (landmarks) and ``compressed``
(strided compression of keys/values).
"""
