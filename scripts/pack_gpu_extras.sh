#!/usr/bin/env bash
# Packs the pure-Python packages the model and loss benchmarks need on the GPU machine
# (which has torch 2.11 and transformers 5.17 but no litgpt, quack or Liger-Kernel) into
# the ignored ./.pywhl/, xz-compressed so that it travels beside ../shared/gpu/fetch-wheels'
# .whl/ within one device call's 64 MiB:
#   - litgpt 0.5.13 and what it imports (lightning, jsonargparse);
#   - transformers 4.52.4 with the tokenizers and huggingface-hub it accepts: the newest
#     transformers thunder 0.2.6 traces (with use_cache=False; 4.53 to 4.57 and 5.x fail in
#     thunder's interpreter: tests/test_transformers_models.py keeps the repro);
#   - quack-kernels (with torch-c-dlpack-ext, einops) and Liger-Kernel: the loss's peers.
# On the GPU machine, after `source .whl/env.sh`:   source .pywhl/env.sh || exit;
# and pass carry: [".whl", ".pywhl"].
set -euo pipefail
OUT="$(pwd)/.pywhl"
git rev-parse --git-dir >/dev/null 2>&1 || { echo "run this from the project checkout" >&2; exit 2; }
grep -qx '/.pywhl/' "$(git rev-parse --git-dir)/info/exclude" 2>/dev/null || echo '/.pywhl/' >> "$(git rev-parse --git-dir)/info/exclude"
tmp="$(mktemp -d)"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp/dl" \
  litgpt==0.5.13 lightning==2.6.6 jsonargparse==4.41.0 docstring-parser typeshed-client \
  transformers==4.52.4 tokenizers==0.21.4 huggingface-hub==0.36.2 \
  quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5 einops liger-kernel==0.8.5 2>&1 | grep -v WARNING || true
mkdir -p "$tmp/site"
for w in "$tmp"/dl/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
rm -rf "$OUT"; mkdir -p "$OUT"
(cd "$tmp/site" && tar -cf - . | xz -T2 -9e > "$OUT/extras.tar.xz")
cat > "$OUT/env.sh" <<'ENV'
# sourced on the GPU machine after .whl/env.sh: unpack once per machine, then put it first
if [ ! -f /tmp/site2/.ok ]; then
  mkdir -p /tmp/site2 && tar -xJf .pywhl/extras.tar.xz -C /tmp/site2 && touch /tmp/site2/.ok || return 1
fi
export PYTHONPATH="/tmp/site2${PYTHONPATH:+:$PYTHONPATH}"
ENV
rm -rf "$tmp"
du -ch "$OUT"/* | tail -1
