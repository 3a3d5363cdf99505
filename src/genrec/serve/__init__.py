"""genrec.serve: the HTTP service (one history encode for SID beams, ANN and ranking), the cross-process
KV pool, two-process mode, versioned hot swap and the load generator. See :mod:`genrec.serve.app`.

The HTTP stack is the ``[serve]`` extra (``pip install 'genrec[serve]'``): without it the rest of genrec prepares,
trains, evaluates and recommends, and importing this package (``genrec serve``, ``genrec bench serve``) fails with
one line that names the extra. The packages are looked up here, not imported, so the check costs nothing."""

import importlib.util

from genrec.errors import MissingExtraError

# what genrec.serve's modules import at their top from the extra (httptools, uvloop and httpx are optional there;
# pydantic is a core dependency)
HTTP_STACK = ("fastapi", "starlette", "uvicorn", "prometheus_client")
_missing = [name for name in HTTP_STACK if importlib.util.find_spec(name) is None]
if _missing:
    raise MissingExtraError(f"genrec serve needs the HTTP stack, which is not installed here (no {', '.join(_missing)})"
                            f": pip install 'genrec[serve]'")

from genrec.serve.kv_pool import KVPool, Lease, PoolSpec, StaleSlotError  # noqa: E402 - after the check

__all__ = ["HTTP_STACK", "KVPool", "Lease", "PoolSpec", "StaleSlotError"]
