# The Loom HTTP worker: `loom worker serve` on $PORT, for Cloud Run or any container platform.
#
# This image holds Loom and its worker; your flows come in a derived image (see docs/deploy.md):
#
#   docker build -t loom-worker .
#   # your project's Dockerfile:
#   #   FROM loom-worker
#   #   COPY myflows/ /srv/app/myflows/
#   #   ENV LOOM_APP=myflows.worker:runtime
#
# Configuration is by environment (nothing secret is baked in):
#   LOOM_APP                      module:attribute of your WorkflowRuntime (or a factory)
#   PORT                          port to listen on (Cloud Run sets it; default 8080)
#   LOOM_WORKER_TOKEN_ENV         name of the variable holding a shared bearer secret, and/or
#   LOOM_WORKER_GOOGLE_AUDIENCE   accept Google-signed ID tokens for this audience (service URL)
#   LOOM_WORKER_GOOGLE_EMAILS     ...only from these service accounts (space-separated)
#   LOOM_WORKER_DRAIN_TIMEOUT     seconds in-flight attempts get on SIGTERM (default 8)
# The worker refuses to start without one of the authentication settings (or LOOM_WORKER_NO_AUTH=1).

ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Loom with the worker (server), Google ID tokens (cloudrun) and the multi-node store (postgres).
COPY pyproject.toml README.md LICENSE /opt/loom/
COPY src /opt/loom/src
RUN pip install "/opt/loom[server,cloudrun,postgres]" && rm -rf /opt/loom

# Your code goes under /srv/app (importable as top-level modules); run as an unprivileged user.
RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin loom \
    && mkdir -p /srv/app && chown loom /srv/app
WORKDIR /srv/app
ENV PYTHONPATH=/srv/app \
    PORT=8080
USER loom
EXPOSE 8080

# Platforms that run Docker health checks get one; Cloud Run uses its own probes (docs/deploy.md).
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s \
    CMD python -c "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\"PORT\"]}/healthz', timeout=2)"

# exec: the worker is PID 1 and gets SIGTERM itself, so it drains instead of being killed.
CMD exec loom worker serve --app "$LOOM_APP" --host 0.0.0.0 --port "$PORT"
