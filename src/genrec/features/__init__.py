"""Item vectors: content (text / encoder / file) and engagement (PPMI-SVD of the train co-interaction graph).

PinGER builds each history item's dense token from content ‖ engagement vectors;
:func:`build_features` writes both into a WorkDir's ``features/`` folder as an
:class:`ItemVectors` store.
"""

from genrec.features.build import build_features
from genrec.features.content import content_vectors, file_vectors, parse_spec, tfidf_vectors
from genrec.features.engagement import cooccurrence, engagement_vectors, ppmi, svd_embed
from genrec.features.store import ItemVectors
from genrec.features.text_quality import measure_text

__all__ = [
    "ItemVectors",
    "build_features",
    "content_vectors",
    "cooccurrence",
    "engagement_vectors",
    "file_vectors",
    "measure_text",
    "parse_spec",
    "ppmi",
    "svd_embed",
    "tfidf_vectors",
]
