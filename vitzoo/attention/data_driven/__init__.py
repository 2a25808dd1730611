"""Content-based buckets: ``reformer`` (LSH), ``routing`` (online k-means) and ``sinkhorn`` (sorted
blocks); their common base and bucket helpers are in :mod:`.bucket`.
"""
