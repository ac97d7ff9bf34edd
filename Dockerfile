# mqstore: one image for every role of the split topology (`mqstore serve --role ...`).
# Build: docker build -t mqstore:dev .
FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY libstore ./libstore
COPY services ./services
# The record codec's C module (libstore/_codec.c) needs a compiler and zlib's headers to build;
# the runtime image has zlib already (Python's zlib module links it).
RUN apt-get update -q \
    && apt-get install -y -q --no-install-recommends gcc libc6-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
# Generated gRPC code first (services/pb is not committed), then the project with it built in.
RUN python -m venv /opt/mqstore \
    && /opt/mqstore/bin/pip install "grpcio-tools>=1.66,<2" \
    && /opt/mqstore/bin/python -m services._protogen \
    && /opt/mqstore/bin/pip install . \
    && /opt/mqstore/bin/python -c "import services.pb, services.cli"

FROM python:3.11-slim
COPY --from=build /opt/mqstore /opt/mqstore
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /data mqstore \
    && mkdir -p /data && chown 10001:10001 /data
ENV PATH=/opt/mqstore/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    MQSTORE_DATA_DIR=/data
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# commitlog 10911 (+ HA 10912), dispatch 10921, index 10931, gateway 8081; metrics 9464 (every role)
EXPOSE 8081 10911 10912 10921 10931 9464
# No CMD: flags would override the MQSTORE_* variables the Kubernetes manifests configure with.
# Alone: docker run -p 8081:8081 mqstore:dev --listen 0.0.0.0:8081   (the embedded suite)
ENTRYPOINT ["mqstore", "serve"]
