"""Speed benchmarks that ship with the package (``genrec bench kernels``): every fast path checked
against its reference, then timed beside its peers in the same run. Apart from the tests: they
only run on demand, on a GPU (or tiny shapes under the Triton CPU interpreter)."""
