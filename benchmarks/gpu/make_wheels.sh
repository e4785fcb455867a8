#!/usr/bin/env bash
# The wheels a lent GPU machine (Python 3.12, torch, transformers, no Ray, no network) needs for quartet's
# GPU script (benchmarks/gpu/device_run.sh), downloaded here into .whl/ (git-ignored), which the device call
# carries (`carry: [".whl"]`). The machine already has everything else `quartet train` imports (pyarrow, rich,
# pyyaml, aiohttp, grpcio, msgpack, click, ...: /work/.library/device/KINDS.md lists it).
#   - Ray 2.60's cp312 wheel, rewritten without ray/jars/ (the Java workers: 35 MB unpacked) and their RECORD
#     lines, so the wheel is ~47 MB instead of 79 and the carried tree stays under the 64 MiB a call allows;
#   - tensordict and pyvers (quartet's batches), jsonschema and its three dependencies (Ray's);
#   - unless --no-trl: TRL, datasets, dill and multiprocess (the side-by-side with TRL's GRPOTrainer; ~2 MB).
# Usage, from the repository root: bash benchmarks/gpu/make_wheels.sh [--no-trl]
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.whl
mkdir -p "$dest"
grep -qx '/.whl/' .gitignore 2>/dev/null || echo '/.whl/' >>.gitignore
wheels=(ray==2.60.0 tensordict==0.15.3 pyvers==0.2.3 jsonschema==4.26.0 referencing==0.37.0
        jsonschema-specifications==2025.9.1 rpds-py==2026.9.1)
[ "${1:-}" = --no-trl ] || wheels+=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" "${wheels[@]}"
# Rewrite Ray's wheel without ray/jars/: entries copied as they are, RECORD without the dropped files' lines.
python3 - "$dest" <<'PY'
import sys, zipfile
from pathlib import Path

for wheel in Path(sys.argv[1]).glob("ray-*.whl"):
    with zipfile.ZipFile(wheel) as src:
        if not any(n.startswith("ray/jars/") for n in src.namelist()):
            continue  # already rewritten
        tmp = wheel.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
            for info in src.infolist():
                if info.filename.startswith("ray/jars/"):
                    continue
                data = src.read(info)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines(keepends=True)
                    data = "".join(x for x in lines if not x.startswith("ray/jars/")).encode()
                dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    print(f"{wheel.name}: ray/jars/ dropped, {wheel.stat().st_size / 1e6:.1f} MB")
PY
du -cb "$dest"/*.whl | tail -1 | awk '{printf "%s: %.1f MB in all (the device call carries at most 64 MiB with the tree)\n", "'"$dest"'", $1 / 1e6}'
