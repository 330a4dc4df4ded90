# One image for every service of compose.yaml: the topic creator, the Faust worker, the mitigation
# consumer and the trace replayer. Built with `--build-arg EXTRAS=dask` it also has the `dask` extra
# (Dask `distributed`): the image of the `dask` profile's scheduler, workers, executor and job, the
# same layers plus one.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

COPY pyproject.toml README.md ./
COPY straggler ./straggler
COPY pipeline ./pipeline
COPY producers ./producers
COPY consumers ./consumers
COPY schemas ./schemas
COPY data ./data
# Empty unless scripts/build-local-images.sh built wheels on the host (no index from the build); it
# then passes PIP_NO_INDEX=1 and PIP_FIND_LINKS=/app/wheelhouse, which pip reads from the environment.
COPY deploy/wheelhouse ./wheelhouse
ARG PIP_NO_INDEX
ARG PIP_FIND_LINKS

RUN pip install --no-cache-dir .
ARG EXTRAS
RUN if [ -n "$EXTRAS" ]; then pip install --no-cache-dir ".[$EXTRAS]"; fi
COPY examples ./examples

CMD ["straggler", "--help"]
