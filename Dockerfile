# One image for every role: web, orchestrator and agents (agents need TensorFlow; so does the plan check).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY kombu_redis ./kombu_redis
COPY celery_steps ./celery_steps
COPY config ./config
COPY contracts ./contracts
COPY orchestrator ./orchestrator
COPY dashboard ./dashboard
COPY worker_agent ./worker_agent
COPY client ./client
COPY scripts ./scripts
COPY manage.py ./

RUN pip install . \
 && pip install --no-deps $(python scripts/no_deps_requirements.py) \
 && DEBUG=0 SECRET_KEY=collectstatic-only python manage.py collectstatic --noinput

RUN useradd --create-home --uid 1000 tfdash && mkdir -p /app/var && chown tfdash /app/var
USER tfdash

EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "config.asgi:application"]
