"""A checkpoint as a Hugging Face Hub repository: the two layouts and reading them back (``layouts``),
the model card (``card``), the export folder (``export``), requests to the Hub (``hub_api``),
uploads now or in the background while a run trains (``uploads``: ``HubUploads`` is a training
hook), bringing a repo or a collection to what is here by content (``sync``), and a whole
sweep as model repos, a dataset repo and a collection (``release``: read by ``sweep_source``, named by
``naming``, its files made by ``dataset``); lm-evaluation-harness on an
exported checkpoint (``lm_eval_bridge``). ``hub_code/`` is not a
module: it holds the transformers wrapper shipped beside the weights.

May import: the wings up to ``gpt.training``.
"""
