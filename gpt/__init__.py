"""gpt-norm-harness: train GPT-2-style models that differ in their norm layer, and compare them.

The README's "Layout" section is the map of this package, in the order a newcomer reads it.
"""
