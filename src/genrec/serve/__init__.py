"""genrec.serve: the HTTP service (one history encode for SID beams, ANN and ranking), the cross-process
KV pool, two-process mode, versioned hot swap and the load generator. See :mod:`genrec.serve.app`."""

from genrec.serve.kv_pool import KVPool, Lease, PoolSpec, StaleSlotError

__all__ = ["KVPool", "Lease", "PoolSpec", "StaleSlotError"]
