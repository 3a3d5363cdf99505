"""genrec: one transformer for the recommendation funnel.

Encode a user's history once; serve Semantic-ID beams (PinGER), ANN retrieval and
ranking (UniPinRec) from that one encoding. See ARCHITECTURE in the README for the
data flow: data -> features -> sid -> train -> eval / serve.
"""

__version__ = "0.1.0"
