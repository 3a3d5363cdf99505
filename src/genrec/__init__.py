"""genrec: one transformer for the recommendation funnel.

Encode a user's history once; serve Semantic-ID beams (PinGER), ANN retrieval and
ranking (UniPinRec) from that one encoding. See "What is inside" in the README for the
data flow (data -> features -> sid -> train -> eval / serve) and the import layers.
"""

from genrec._version import __version__

# The library API (genrec.recipes.pipeline), imported on first use so that `import genrec` stays light.
# (not `train`/`eval`: those are subpackages, whose module attributes would shadow a function of the name)
_API = ("prepare", "append", "synthesize", "build_item_features", "build_semantic_ids", "train_model", "tune_fusion",
        "evaluate", "recommender", "load_catalog", "open_store")
__all__ = ["__version__", *_API]


def __getattr__(name: str):  # noqa: ANN202 - PEP 562 lazy attributes
    if name in _API:
        from genrec.recipes import pipeline  # lazy (PEP 562): `import genrec` loads no recipe, torch or Iceberg

        return getattr(pipeline, name)
    raise AttributeError(f"module 'genrec' has no attribute {name!r}")

