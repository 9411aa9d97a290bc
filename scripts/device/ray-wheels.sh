#!/usr/bin/env bash
# Run HERE (the development machine, which reaches PyPI), in the repository root, before a device call
# that needs Ray (scripts/device/i38.sh): puts into .ray/ (git-ignored) the wheels the offline GPU host
# lacks for Ray: ray itself, cut to what kerngen's --ray uses, and jsonschema with its needs (the host
# has Ray's other needs: click, filelock, msgpack, packaging, protobuf, pyyaml, requests, attrs).
#
# Why cut: Ray's wheel is 79 MB and a device call carries 64 MiB in all (the repository and .whl/
# included). Left out, never imported by Ray's core, its `ray start` or kerngen: ray/jars (the Java
# workers, 32 MB; Ray starts no Java worker without them), the dashboard's web page (its server is
# not started: --include-dashboard=false), and the libraries on top of Ray (rllib, data, serve, tune,
# train, llm). What is left is ~40 MB: it travels in ONE call with the repository (~5 MB) and .whl/.
#
# Usage: bash scripts/device/ray-wheels.sh [PYTHON_VERSION]   (3.12, the GPU host's, by default;
#        another version builds the same cut for a local check of it)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
py=${1:-3.12}
tag="cp${py/./}"
out=.ray
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  plat+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  "${plat[@]}" -d "$raw" ray==2.60.0 jsonschema jsonschema-specifications referencing rpds-py
rm -rf "$out" && mkdir -p "$out"
cp "$raw"/jsonschema*.whl "$raw"/referencing*.whl "$raw"/rpds_py*.whl "$out"/
python3 - "$raw"/ray-2.60.0-"$tag"-*.whl "$out" <<'EOF'
import pathlib, sys, zipfile

src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
CUT = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/data/", "ray/serve/", "ray/tune/", "ray/train/",
       "ray/llm/")
dst = out / src.name
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zout:
    for info in zin.infolist():
        if info.filename.startswith(CUT):
            continue
        data = zin.read(info)
        if info.filename.endswith(".dist-info/RECORD"):  # the files left out leave the record too
            data = b"".join(line for line in data.splitlines(keepends=True)
                            if not line.decode().startswith(CUT))
        zout.writestr(info, data)
print(f"{dst}: {src.stat().st_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.1f} MB")
EOF
for f in /.ray/ /.whl/; do  # worktrees share the main checkout's exclude file
  grep -qxF "$f" "$(git rev-parse --git-common-dir)/info/exclude" || echo "$f" >> "$(git rev-parse --git-common-dir)/info/exclude"
done
du -sh "$out"
echo "carry .ray (and .whl) in the device call: see scripts/device/i38.sh"
