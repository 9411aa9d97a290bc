# Sourced at the start of every device command, from the repository root on the offline GPU host:
#   source scripts/device/setup.sh
# Installs the carried wheels (.whl/: what the host lacks, see ../shared/tools/offline-wheels.sh) and
# kerngen itself (editable, no dependencies, no network), so that `python3 -m pytest` and `kerngen` work.
# a later call of the same lease may carry other things (.ray/) instead: what an earlier call installed stays
if [ ! -f /tmp/site/.kerngen-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "device setup: the wheels in .whl/ did not install" >&2; return 1; }
  touch /tmp/site/.kerngen-wheels
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 \
  || { echo "device setup: pip install -e . failed" >&2; return 1; }
python3 -c "from clang import cindex; cindex.Index.create()" 2>/dev/null || echo "device setup: libclang is not in .whl/:" \
  "kerngen refuses every compile without its source policy (shared/tools/offline-wheels.sh .whl libclang)" >&2
export PATH="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
python3 -c "import torch, kerngen; print('device:', torch.cuda.get_device_name(0), 'x', torch.cuda.device_count(), '| torch', torch.__version__)"
