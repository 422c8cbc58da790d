# One image for every Vigil role; the command picks the role:
#   vigil serve | vigil consume | vigil judge-worker | vigil detector
# Rule packs, judge definitions and dashboards are baked in under /app and can be replaced by mounts
# (the Helm chart mounts its ConfigMaps over /app/rules and /app/judges).
# /app is root-owned and read-only to Vigil; the one writable place is /var/lib/vigil (the default
# SQLite database, HOME), a VOLUME so that `docker run --read-only` works and data outlives the container.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/vigil
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY service ./service
RUN /opt/vigil/bin/pip install -c constraints.txt .

FROM python:${PYTHON_VERSION}-slim
ARG VIGIL_UID=10001
RUN groupadd --system --gid ${VIGIL_UID} vigil \
    && useradd --system --uid ${VIGIL_UID} --gid vigil --home-dir /var/lib/vigil --shell /usr/sbin/nologin vigil \
    && install -d -o vigil -g vigil -m 0750 /var/lib/vigil
COPY --from=build /opt/vigil /opt/vigil
WORKDIR /app
# Installed outside a checkout, Vigil resolves its default rules/, judges/ and dashboards/ against the
# working directory: the baked-in copies here.
COPY rules ./rules
COPY judges ./judges
COPY dashboards ./dashboards
ENV PATH=/opt/vigil/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIGIL_HOST=0.0.0.0 \
    VIGIL_PORT=8000 \
    VIGIL_METRICS_PORT=9108 \
    VIGIL_DATABASE_URL=sqlite:////var/lib/vigil/vigil.db
LABEL org.opencontainers.image.title="vigil" \
      dev.vigil.roles="serve consume judge-worker detector"
VOLUME /var/lib/vigil
USER ${VIGIL_UID}:${VIGIL_UID}
EXPOSE 8000 9108 4317
ENTRYPOINT ["vigil"]
CMD ["serve"]
