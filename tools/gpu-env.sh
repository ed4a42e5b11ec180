# Source from the repository root on a GPU host without registry access, after building .gpu/ with
# ../shared/gpu/make-bundle.sh: installs TransformerEngine, torchao and plotly into /tmp/site and makes
# fp8bench (with its `fp8bench` command) and fp8kernels importable from this checkout.
bash .gpu/install.sh .gpu >/dev/null
export PYTHONPATH="/tmp/site:$PWD"
# kernels/ is installed as fp8kernels; a legacy editable install (no build isolation) cannot rename it.
ln -sfn "$PWD/kernels" /tmp/site/fp8kernels
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
