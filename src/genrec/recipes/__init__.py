"""Recipes: the pipeline's steps as library functions and the runs that chain them, on top of every
other layer (and imported by nothing in genrec but the CLI and the root package's lazy API).

* :mod:`~genrec.recipes.pipeline` -- prepare, features, SIDs, train, fusion tune, eval, recommender
  (``genrec.<name>`` reaches them too);
* :mod:`~genrec.recipes.training` -- ``genrec train``'s run, with the trainer's periodic validation;
* :mod:`~genrec.recipes.model_sids` -- ``genrec sid build --source model``: SIDs from a trained run's item vectors;
* :mod:`~genrec.recipes.quickstart` -- ``genrec quickstart``: the whole pipeline with a summary;
* :mod:`~genrec.recipes.coldstart` -- ``genrec cold-start``: withhold items, train, score them;
* :mod:`~genrec.recipes.cold_block` -- the cold items' served engagement block length, scored on validation.
"""
