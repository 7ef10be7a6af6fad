# One image for both daemons: `hami device-plugin` (DaemonSet, runs as root for kubelet's
# device-plugin directory) and `hami scheduler` (Deployment, runs as the image's non-root user).
# Kubernetes probes check them; the image has no HEALTHCHECK.
#
#   docker build -t hami-plugin:0.1.0 .
#
# Python: the version pyproject.toml's requires-python names (tests/deployment checks it).
# Dependencies: exactly daemonset/requirements.lock, the versions the test suite ran with.

FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/hami
WORKDIR /src
# dependencies first: this layer is reused until the lock changes
COPY daemonset/requirements.lock ./requirements.lock
RUN /opt/hami/bin/pip install --no-cache-dir --no-deps -r requirements.lock
COPY pyproject.toml README.md ./
COPY docs/LICENSE ./docs/LICENSE
COPY hami_plugin ./hami_plugin
# --no-deps: nothing beyond the lock; pip check fails the build if the lock misses something
RUN /opt/hami/bin/pip install --no-cache-dir --no-deps . \
    && /opt/hami/bin/pip check

FROM python:3.11-slim-bookworm
ENV PATH=/opt/hami/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 hami \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin hami
COPY --from=build /opt/hami /opt/hami
USER 10001:10001
ENTRYPOINT ["hami"]
CMD ["--help"]
