"""Inference on a trained run: the :class:`~genrec.infer.recommender.Recommender` (one history encode ->
SID beams + ANN -> L1 ranking on the same cache), the Faiss ANN index over item vectors and the L1
score-fusion weights stored per checkpoint.

It reads a run's checkpoint through :mod:`genrec.model.checkpoint_io` and holds the model with its
catalogue tensors in a :class:`~genrec.infer.catalog_model.CatalogModel`: it never imports
``genrec.train``. Kept apart from ``genrec.serve`` so offline evaluation and the HTTP service use the
same retrieval code without either importing the other.
"""
