"""Candidate generation outside the SID decoder: the Faiss ANN index over item vectors.

Kept apart from ``genrec.serve`` so offline evaluation and the HTTP service use the same
retrieval code without either importing the other.
"""
