# The one Tether image: every control-plane component (`tether identity|destination|injector serve`),
# the proxy (the entrypoint, as Linkerd's proxy image), `tether init` (iptables, the linkerd-init
# container) and the CLI. `tether install` references it as ghcr.io/tether-mesh/tether:<version>.
#
#   docker build -t ghcr.io/tether-mesh/tether:0.1.0 .
#
# NOTE: this image has not been built on the machines Tether is developed on (no container
# runtime there); see docs/kubernetes.md for what was and was not verified.

# -- build: a wheel, with tether.api generated from proto/ by the build hook (grpcio-tools) --
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip build
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY proto ./proto
COPY src ./src
RUN python -m build --wheel --outdir /dist .

# -- runtime --
FROM python:3.11-slim-bookworm
# iptables (nft and legacy back ends) and iproute2 for `tether init`; nothing else from Debian.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /dist/*.whl /tmp/
RUN pip install --no-cache-dir /tmp/*.whl && rm -f /tmp/*.whl
# The proxy runs as 2102 and the controllers as 2103 (set by the pod specs); neither needs a home.
RUN groupadd --system --gid 2103 tether \
 && useradd --system --uid 2103 --gid 2103 --no-create-home --shell /usr/sbin/nologin tether \
 && useradd --system --uid 2102 --no-create-home --shell /usr/sbin/nologin tether-proxy
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TETHER_HOME=/var/run/tether
USER 2102
# The injected proxy container relies on the entrypoint (it sets no command); the control-plane
# Deployments and the init containers set `command: [tether, ...]` themselves.
ENTRYPOINT ["tether", "proxy"]
