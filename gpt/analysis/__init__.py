"""Runs side by side: statistics (``stats``), the comparison table that refuses runs differing in more
than the norm (``table``), its markdown (``report``), and every chart (``charts``).

May import: the wings up to ``gpt.publish``.
"""
