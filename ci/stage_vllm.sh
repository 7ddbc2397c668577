#!/bin/bash
# Build the offline bundle of one vLLM release for the H200 host (Python 3.12, torch 2.11.0+cu130, no network), in
# the form of ../shared/gpu/prepare.sh (which builds vLLM 0.26.0's): a slimmed vLLM, the wheels the host lacks, the
# Transformer Engine sdist, one tar split into parts of at most 60 MiB, a manifest and a host script.
#
# Usage (from the project root):  bash ci/stage_vllm.sh VERSION [DEST]      DEST defaults to .gpu-stage-vllm-VERSION
#
# What differs from the 0.26 bundle is read from the registry, not written here:
# * vLLM's own `torch==` pin (its compiled kernels and DeepGEMM are built against it). A pin other than the host's
#   torch brings that torch wheel (PyPI's x86_64 torch is the CUDA 13.0 build: checked from its cuda-toolkit pin),
#   the triton and NCCL that torch pins (torch 2.13 / 2.14 call NCCL symbols 2.28.9 lacks), and vLLM's torchvision
#   pin. The host's CUDA 13.0 libraries, cuSPARSELt and NVSHMEM serve it (every symbol torch 2.13 / 2.14 needs
#   is in the host's versions); its cuDNN is older than the one torch pins, which only torch.backends.cudnn refuses
#   (vLLM's text path never calls it; STAGE_CUDNN=1 ships the pinned one too, 349-528 MiB more).
# * vLLM's `==` pins of the small wheels ../shared/gpu/wheels.txt lists replace that list's versions, and the
#   Hugging Face stack (transformers, huggingface_hub, tokenizers, safetensors, hf_xet) is resolved by pip against
#   vLLM's own bounds.
# The host script is ../shared/gpu/host.sh with this bundle's own folders (/tmp/site-vllm-VERSION,
# /tmp/gpu-stage-vllm-VERSION, /tmp/gpu-env-vllm-VERSION.sh), so it installs beside the 0.26 bundle on one machine.
# Transformer Engine's torch extension is built on the host against the bundle's torch, as for 0.26.
#
# Environment: SHARED_GPU (default ../shared/gpu from the project root), GPU_BUNDLE_CACHE (downloads, default
# /tmp/fp8check-gpu-cache), HOST_TORCH (2.11.0), HOST_NCCL (2.28.9), HOST_CUDA_MAJOR (13), STAGE_CUDNN (0),
# PART_MIB (60), STAGE_TORCH (1; 0: no torch / triton / NCCL, vLLM on the host's torch 2.11 against its pin -- its
# kernels need only torch's stable C ABI, every symbol of which 0.26's kernels need too, but its DeepGEMM before 0.34
# is built against the pinned torch's C++ ABI: run it with VLLM_USE_DEEP_GEMM=0; untried on the host).
# docs/vllm-versions.md ("Staging a newer vLLM") has the figures this builds.
set -euo pipefail
VERSION=${1:?usage: bash ci/stage_vllm.sh VERSION [DEST]}
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "stage_vllm: VERSION must look like 0.30.0, got '$VERSION'" >&2; exit 2; }
DEST=${2:-.gpu-stage-vllm-$VERSION}
ROOT=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
SHARED_GPU=${SHARED_GPU:-$ROOT/../shared/gpu}
for f in wheels.txt host.sh fetch_sdist.py; do
  [[ -f $SHARED_GPU/$f ]] || { echo "stage_vllm: $SHARED_GPU/$f not found: set SHARED_GPU to the shared gpu folder" >&2; exit 2; }
done
CACHE=${GPU_BUNDLE_CACHE:-/tmp/fp8check-gpu-cache}
C=$CACHE/vllm-$VERSION
HOST_TORCH=${HOST_TORCH:-2.11.0}; HOST_NCCL=${HOST_NCCL:-2.28.9}; HOST_CUDA_MAJOR=${HOST_CUDA_MAJOR:-13}
PART_MIB=${PART_MIB:-60}
mkdir -p "$DEST" "$C/wheels" "$CACHE/sdist" "$C/dl"
if [[ $DEST != /* ]] && git rev-parse --git-dir >/dev/null 2>&1; then
  ex="$(git rev-parse --git-dir)/info/exclude"; mkdir -p "$(dirname "$ex")"
  grep -qx "/$DEST/" "$ex" 2>/dev/null || echo "/$DEST/" >> "$ex"
fi
plat=""; for n in 17 18 24 27 28 31 34 35 38 39; do plat="$plat --platform manylinux_2_${n}_x86_64"; done
# the machine's pip constraints are for this machine's Python, not the host's
pipdl() { PIP_CONSTRAINT= python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
          $plat --platform manylinux2014_x86_64 --platform manylinux1_x86_64 "$@" 2>&1 | grep -v WARNING || true; }
meta() {   # meta WHEEL: the wheel's METADATA on stdout
  unzip -p "$1" '*.dist-info/METADATA'
}
pin() {    # pin NAME < METADATA: the exact version an unconditional `Requires-Dist: NAME==X` names
  { grep -iE "^Requires-Dist: $1==" | grep -v "extra ==" | head -1 | sed -E 's/.*==([^ ;]+).*/\1/'; } || true
}
spec() {   # spec NAME < METADATA: the unconditional requirement line for NAME, as pip reads it
  { grep -iE "^Requires-Dist: $1[ <>=!~;]" | grep -v "extra ==" | head -1 | sed -E 's/^Requires-Dist: //; s/;.*//; s/ //g'; } || true
}

# 1. vLLM, slimmed as prepare.sh slims 0.26 (no flash-attn / flashmla / qutlass / sm100 kernels, DeepGEMM for
#    CPython 3.12 only); the kernels of architectures the host does not serve that later releases added
#    (DeepSeek's sparse-attention selector, Kimi's KDA) are left out too
pipdl --no-deps -d "$C/dl" "vllm==$VERSION"
WHL=$(ls "$C"/dl/vllm-"$VERSION"-*.whl 2>/dev/null | head -1)
[[ -n $WHL ]] || { echo "stage_vllm: vllm==$VERSION has no manylinux x86_64 wheel on the index" >&2; exit 2; }
VMETA=$(meta "$WHL")
if [[ ! -f $C/vllm-min.tar.xz ]]; then
  rm -rf "$C/x" && mkdir -p "$C/x" && (cd "$C/x" && unzip -q "$WHL")
  (cd "$C/x" && tar cf - --exclude='__pycache__' --exclude='vllm/vllm_flash_attn/*.so' --exclude='vllm/vllm-rs' \
    --exclude='vllm/third_party/fmha_sm100' \
    --exclude='vllm/_flashmla_C.abi3.so' --exclude='vllm/_flashmla_extension_C.abi3.so' --exclude='vllm/_qutlass_C.abi3.so' \
    --exclude='vllm/_deepselect_C.abi3.so' --exclude='vllm/_flashkda_C.abi3.so' \
    --exclude='vllm/third_party/deep_gemm/_C.cpython-310*' --exclude='vllm/third_party/deep_gemm/_C.cpython-311*' \
    --exclude='vllm/third_party/deep_gemm/_C.cpython-313*' --exclude='vllm/third_party/deep_gemm/_C.cpython-314*' \
    vllm "vllm-$VERSION.dist-info") | xz -T0 -6 > "$C/vllm-min.tar.xz.tmp"
  mv "$C/vllm-min.tar.xz.tmp" "$C/vllm-min.tar.xz"; rm -rf "$C/x"
fi

# 2. torch: vLLM's pin; when it is not the host's, that torch and what it pins that the host's does not have
rm -f "$C"/wheels/*.whl
TORCH=$(pin torch <<< "$VMETA")
[[ -n $TORCH ]] || { echo "stage_vllm: vllm==$VERSION pins no torch version (Requires-Dist: torch==...)" >&2; exit 2; }
if [[ $TORCH != "$HOST_TORCH" && ${STAGE_TORCH:-1} == 1 ]]; then
  pipdl --no-deps -d "$C/wheels" "torch==$TORCH"
  TW=$(ls "$C"/wheels/torch-"$TORCH"-*.whl); TMETA=$(meta "$TW")
  CUDA=$(grep -E "^Requires-Dist: cuda-toolkit\[" <<< "$TMETA" | sed -E 's/.*==([0-9]+)\..*/\1/')
  [[ $CUDA == "$HOST_CUDA_MAJOR" ]] || { echo "stage_vllm: torch $TORCH on the index is built for CUDA ${CUDA:-?}, the host runs CUDA $HOST_CUDA_MAJOR" >&2; exit 2; }
  TRITON=$(spec triton <<< "$TMETA"); NCCL=$(pin nvidia-nccl-cu13 <<< "$TMETA")
  pipdl --no-deps -d "$C/wheels" "$TRITON"
  [[ -z $NCCL || $NCCL == "$HOST_NCCL" ]] || pipdl --no-deps -d "$C/wheels" "nvidia-nccl-cu13==$NCCL"
  TV=$(pin torchvision <<< "$VMETA"); [[ -z $TV ]] || pipdl --no-deps -d "$C/wheels" "torchvision==$TV"
  if [[ ${STAGE_CUDNN:-0} == 1 ]]; then
    CUDNN=$(pin nvidia-cudnn-cu13 <<< "$TMETA"); pipdl --no-deps -d "$C/wheels" "nvidia-cudnn-cu13==$CUDNN"
  fi
fi

# 3. the small wheels the host image lacks (the shared list), at vLLM's own `==` pins where it pins one
rm -f "$C/wheels.txt"
while IFS= read -r line; do
  name=${line%%==*}
  if [[ -z $line || $line == \#* ]]; then echo "$line"; continue; fi
  v=$(pin "$name" <<< "$VMETA"); echo "$name==${v:-${line#*==}}"
done < "$SHARED_GPU/wheels.txt" > "$C/wheels.txt"
for name in orjson; do     # hard requirements a later vLLM imports where 0.26 had none
  s=$(spec "$name" <<< "$VMETA"); [[ -z $s ]] || echo "$s" >> "$C/wheels.txt"
done
pipdl --no-deps -d "$C/wheels" -r "$C/wheels.txt"
# the Hugging Face stack, resolved together against vLLM's bounds (its newest hub may exclude the newest transformers)
rm -rf "$C/hf" && mkdir -p "$C/hf"
pipdl -d "$C/hf" $(spec transformers <<< "$VMETA") $(spec huggingface_hub <<< "$VMETA") $(spec tokenizers <<< "$VMETA")
for p in transformers huggingface_hub tokenizers safetensors hf_xet; do cp "$C"/hf/${p}-*.whl "$C/wheels/" 2>/dev/null || true; done
[[ -f $CACHE/sdist/transformer_engine_torch-2.20.2.tar.gz ]] || \
  python3 "$SHARED_GPU/fetch_sdist.py" transformer-engine-torch 2.20.2 "$CACHE/sdist"
mkdir -p "$C/sdist" && cp "$CACHE"/sdist/transformer_engine_torch-2.20.2.tar.gz "$C/sdist/"

# 4. one tar, split into parts; the host script with this bundle's own folders
rm -f "$DEST"/part_* "$DEST/manifest"
tar cf "$C/bundle.tar" -C "$C" vllm-min.tar.xz wheels sdist
split -b "${PART_MIB}M" -d -a 2 "$C/bundle.tar" "$DEST/part_"
{ echo "parts $(ls "$DEST"/part_* | wc -l)"; echo "sha256 $(sha256sum "$C/bundle.tar" | cut -d' ' -f1)";
  echo "vllm $VERSION"; ls "$C"/wheels/torch-"$TORCH"-*.whl >/dev/null 2>&1 && echo "torch $TORCH" ||
  echo "torch host $HOST_TORCH (vLLM pins $TORCH)"; } > "$DEST/manifest"
sed -e "s#T=/tmp/gpu-stage;#T=/tmp/gpu-stage-vllm-$VERSION;#" -e "s#SITE=/tmp/site\$#SITE=/tmp/site-vllm-$VERSION#" \
    -e "s#/tmp/gpu-env.sh#/tmp/gpu-env-vllm-$VERSION.sh#g" "$SHARED_GPU/host.sh" > "$DEST/host.sh"
grep -q "/tmp/site-vllm-$VERSION" "$DEST/host.sh" || { echo "stage_vllm: $SHARED_GPU/host.sh changed: its SITE line was not rewritten" >&2; exit 1; }
chmod +x "$DEST/host.sh"
rm -f "$C/bundle.tar"
echo "stage_vllm: vllm $VERSION (torch $TORCH), $(ls "$DEST"/part_* | wc -l) parts of <= $PART_MIB MiB in $DEST"
( cd "$C" && du -m vllm-min.tar.xz wheels/*.whl sdist/* | sort -rn | head -12 )
cat "$DEST/manifest"
