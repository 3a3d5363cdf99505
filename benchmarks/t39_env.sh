# Sourced by the device scripts that need Triton 3.9 (the GPU image has 3.6): unpacks the carried
# `.t39/triton39.tar.xz` (made by `bash benchmarks/pack_triton.sh`) into $T39 (default /tmp/t39) unless a
# previous call on the same machine already did. Put "$T39" first on PYTHONPATH, with
# TRITON_BACKENDS_IN_TREE=1, in the commands that should import it.
T39=${T39:-/tmp/t39}
export T39
[ -d "$T39/triton" ] || python3 -c "import tarfile; tarfile.open('.t39/triton39.tar.xz').extractall('$T39')" || exit 1
