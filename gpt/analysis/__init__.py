"""Runs side by side: statistics (``stats``), the comparison table that refuses runs differing in more
than the norm (``table``), its markdown (``report``), every chart (``charts``), the sweep of norm
types x seeds (``experiment``), speed benchmarks (``timing``, ``mfu``) and the GPU check's budgeted
stages (``stages``).

May import: the wings up to ``gpt.publish``.
"""
