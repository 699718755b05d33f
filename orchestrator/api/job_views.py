from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response

from contracts.names import ARTIFACT_NAME_PATTERN
from orchestrator.api.job_serializers import (
    ArtifactSerializer,
    HostSamplesSerializer,
    JobInputSerializer,
    JobSerializer,
    LogPageSerializer,
    MetricsPageSerializer,
    PlanSerializer,
    PrioritySerializer,
    TaskSerializer,
)
from orchestrator.jobs import lifecycle
from orchestrator.metrics import history, log_reader
from orchestrator.metrics import hosts as host_load
from orchestrator.metrics import tensorboard as tensorboard_export
from orchestrator.models import Job, JobArtifact, MetricPoint, Task
from orchestrator.objectstore import store as storage
from orchestrator.scheduler import queue_view
from orchestrator.submit import submission

log = logging.getLogger(__name__)

METRICS_PAGE = 10_000
_CURSOR = re.compile(r"^-?[0-9]{1,12}$")  # ASCII digits only: int() takes "²" and "٣" too
CSV_PAGE = 5000
_RAW_HELP = (
    "1: each line as the task wrote it; by default each line as a terminal shows it (a progress bar drawn with "
    "carriage returns and backspaces at its last state, ANSI colours dropped)"
)


class JobViewSet(mixins.CreateModelMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = JobSerializer
    parser_classes = [MultiPartParser, FormParser, JSONParser]

    def get_queryset(self) -> QuerySet[Job]:
        if getattr(self, "swagger_fake_view", False):  # schema generation: no user; lets it type `id` as integer
            return Job.objects.none()
        queryset = Job.objects.visible_to(self.request.user)
        state = self.request.query_params.get("state")
        return queryset.filter(state=state) if state else queryset

    @extend_schema(
        request={"multipart/form-data": JobInputSerializer, "application/json": JobInputSerializer},
        responses={201: JobSerializer},
        parameters=[OpenApiParameter("state", str, description="only jobs in this state")],
    )
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        incoming = JobInputSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        job, upload = incoming.build(request.user)
        try:
            submission.submit(job, upload)
        except submission.JobInvalid as exc:  # what only submitting checks: the per-user limit on active jobs
            return Response(exc.errors, status=status.HTTP_400_BAD_REQUEST)
        return Response(JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(
        request={"multipart/form-data": JobInputSerializer, "application/json": JobInputSerializer},
        responses={200: PlanSerializer},
        description="Validate a job and return its placement and every task's TF_CONFIG without launching anything.",
    )
    @action(detail=False, methods=["post"])
    def plan(self, request: Request) -> Response:
        incoming = JobInputSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        job, _upload = incoming.build(request.user, require_program=False)
        return Response(PlanSerializer(submission.describe_plan(job)).data)

    @extend_schema(
        responses={200: TaskSerializer(many=True)},
        parameters=[OpenApiParameter("attempt", str, description="an attempt number, or 'all'; default: current")],
    )
    @action(detail=True, methods=["get"], pagination_class=None)
    def tasks(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        tasks = job.tasks.select_related("host")
        attempt = request.query_params.get("attempt") or ""
        if attempt != "all":
            # ASCII digits only: "²".isdigit() is true and int() refuses it.
            if attempt and not (attempt.isascii() and attempt.isdigit()):
                return Response(
                    {"attempt": [f"{attempt[:20]!r} is not an attempt number (or 'all')."]},
                    status=status.HTTP_400_BAD_REQUEST,
                )
            tasks = tasks.filter(attempt=int(attempt) if attempt else job.attempt)
        return Response(TaskSerializer(tasks, many=True).data)

    @extend_schema(
        request=None,
        responses={200: JobSerializer, 403: OpenApiResponse(description="staff only"), 409: OpenApiResponse()},
    )
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk: str | None = None) -> Response:
        """Staff: a waiting job keeps its place but is not started until released."""
        return self._queue_action(request, lambda job: queue_view.hold(job.pk, by=request.user.get_username()))

    @extend_schema(request=None, responses={200: JobSerializer, 403: OpenApiResponse(), 409: OpenApiResponse()})
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk: str | None = None) -> Response:
        return self._queue_action(request, lambda job: queue_view.release(job.pk, by=request.user.get_username()))

    @extend_schema(
        request=PrioritySerializer, responses={200: JobSerializer, 403: OpenApiResponse(), 409: OpenApiResponse()}
    )
    @action(detail=True, methods=["post"])
    def priority(self, request: Request, pk: str | None = None) -> Response:
        """Staff: move a waiting job to another priority class."""
        asked = PrioritySerializer(data=request.data)
        asked.is_valid(raise_exception=True)
        name = asked.validated_data["priority"]
        return self._queue_action(
            request, lambda job: queue_view.set_priority(job.pk, name, by=request.user.get_username())
        )

    def _queue_action(self, request: Request, act: Any) -> Response:
        job = self.get_object()
        if not request.user.is_staff:
            return Response({"detail": "Only staff may change the queue."}, status=status.HTTP_403_FORBIDDEN)
        try:
            act(job)
        except queue_view.QueueActionRefused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(JobSerializer(job).data)

    @extend_schema(request=None, responses={200: JobSerializer, 409: OpenApiResponse(description="already ended")})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        if not lifecycle.cancel(job.pk, by=request.user.get_username()):
            return Response({"detail": f"Job is already {job.state}."}, status=status.HTTP_409_CONFLICT)
        job.refresh_from_db()
        return Response(JobSerializer(job).data)

    @extend_schema(
        responses={200: MetricsPageSerializer},
        parameters=[
            OpenApiParameter(
                "since",
                int,
                description="return points numbered above this cursor (the job's point sequence, default 0)",
            ),
            OpenApiParameter("name", str, description="only this metric"),
            OpenApiParameter("task", int, description="only this task id"),
        ],
        description="Metric points in arrival order, at most 10,000 a page; pass `next` back as `since` to continue.",
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            since = int(request.query_params.get("since", 0))
            task_filter = request.query_params.get("task")
            task_id = int(task_filter) if task_filter else None
        except ValueError:
            return Response({"detail": "since and task are integers."}, status=status.HTTP_400_BAD_REQUEST)
        rows = history.points_after(
            job.pk, since, limit=METRICS_PAGE, name=request.query_params.get("name") or None, task_id=task_id
        )
        return Response(
            {
                "columns": history.POINT_COLUMNS,
                "points": rows,
                "next": rows[-1][0] if rows else since,
                "more": len(rows) == METRICS_PAGE,
            }
        )

    @extend_schema(
        responses={200: HostSamplesSerializer},
        parameters=[
            OpenApiParameter("since", float, description="only samples taken after this time (wall seconds)"),
        ],
        description=(
            "CPU, memory and per-GPU samples of every host that ran a task of the job, over the job's time on that "
            "host (its tasks' start to end, 5 s on each side, plus the nearest sample before and after), in time "
            "order per host; `windows` gives each host's span (`end` null while a task still runs there)."
        ),
    )
    @action(detail=True, methods=["get"])
    def hosts(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        try:
            since = float(request.query_params["since"]) if "since" in request.query_params else None
        except ValueError:
            return Response({"detail": "since is a number."}, status=status.HTTP_400_BAD_REQUEST)
        windows, samples = host_load.job_samples(job.pk, after=since)
        return Response({"windows": [w.as_dict() for w in windows], "samples": samples})

    @extend_schema(
        responses={(200, "text/csv"): str},
        description="Every stored metric point of the job, not downsampled, as CSV (streamed).",
    )
    @action(detail=True, methods=["get"], url_path="metrics-csv")
    def metrics_csv(self, request: Request, pk: str | None = None) -> StreamingHttpResponse:
        job = self.get_object()
        columns = ("id", "task__type", "task__index", "task__attempt", "phase", "name", "step", "epoch", "value", "ts")

        def page(after: int) -> list[tuple[Any, ...]]:
            points = MetricPoint.objects.filter(job=job, id__gt=after).order_by("id")
            return list(points.values_list(*columns)[:CSV_PAGE])

        async def lines() -> AsyncIterator[str]:
            # Async, a page at a time by id: under ASGI Django reads a synchronous body whole before sending it.
            buffer = io.StringIO()
            writer = csv.writer(buffer)
            writer.writerow(
                ["id", "task_type", "task_index", "attempt", "phase", "name", "step", "epoch", "value", "ts"]
            )
            after = 0
            while True:
                rows = await sync_to_async(page)(after)
                writer.writerows(rows)
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
                if len(rows) < CSV_PAGE:
                    break
                after = rows[-1][0]

        response = StreamingHttpResponse(lines(), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="job{job.pk}-metrics.csv"'
        return response

    @extend_schema(
        responses={(200, "application/gzip"): bytes},
        description=(
            "The job's stored metric points as a TensorBoard logdir, a .tar.gz streamed as it is written: "
            "`job<id>/<task>/<phase>/events.out.tfevents.*`, one run per task (`worker-0`, `chief-0`, "
            "`worker-0.attempt2`, `worker-1.restart1`) and phase (`train`, `epoch_end`, `custom`), one scalar tag "
            "per metric name, each point with its step and wall time (float64 values). "
            "`tar xzf` it and run `tensorboard --logdir job<id>`."
        ),
    )
    @action(detail=True, methods=["get"])
    def tensorboard(self, request: Request, pk: str | None = None) -> StreamingHttpResponse:
        job = self.get_object()
        response = StreamingHttpResponse(tensorboard_export.archive(job.pk), content_type="application/gzip")
        response["Content-Disposition"] = f'attachment; filename="job{job.pk}-tensorboard.tar.gz"'
        return response

    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None)
    def artifacts(self, request: Request, pk: str | None = None) -> Response:
        job = self.get_object()
        listing = job.artifacts.order_by("name").values("name", "size", "sha256", "created_at")
        return Response([{**a, "url": f"/api/jobs/{job.pk}/artifacts/{a['name']}/"} for a in listing])

    @extend_schema(
        responses={
            (200, "application/octet-stream"): bytes,
            302: OpenApiResponse(description="in the cluster's object store: a presigned GET, valid 10 minutes"),
        }
    )
    @action(detail=True, methods=["get"], url_path=rf"artifacts/(?P<name>{ARTIFACT_NAME_PATTERN})")
    def artifact(self, request: Request, pk: str | None = None, name: str | None = None) -> HttpResponse:
        job = self.get_object()
        artifact = get_object_or_404(JobArtifact.objects.defer("content"), job=job, name=name)
        if artifact.key:
            # The bytes are in the object store: a short-lived URL for this one key; the hash to check them by.
            filename = f"job{job.pk}-{artifact.name}"
            try:
                url = storage.download_url(job.cluster, artifact.key, filename)
            except storage.StoreUnavailable as exc:
                log.error("job %s artifact %s: %s", job.pk, artifact.name, exc)
                return HttpResponse("The object store cannot be used now.", status=503, content_type="text/plain")
            redirect = HttpResponseRedirect(url)
            redirect["X-Content-SHA256"] = artifact.sha256
            redirect["Cache-Control"] = "no-store"
            return redirect
        response = HttpResponse(bytes(artifact.content), content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="job{job.pk}-{artifact.name}"'
        response["X-Content-SHA256"] = artifact.sha256
        return response

    @extend_schema(
        responses={(200, "text/plain"): str},
        parameters=[
            OpenApiParameter("download", bool, description="as an attachment"),
            OpenApiParameter(log_reader.RAW_PARAM, bool, description=_RAW_HELP),
        ],
    )
    @action(detail=True, methods=["get"], url_path=r"logs/(?P<task_id>\d+)")
    def logs(self, request: Request, pk: str | None = None, task_id: str | None = None) -> StreamingHttpResponse:
        """The task's whole log, streamed a page of lines at a time (metrics/log_reader.py)."""
        job = self.get_object()
        task = get_object_or_404(Task, pk=task_id, job=job)
        raw = log_reader.wants_raw(request.query_params.get(log_reader.RAW_PARAM))
        filename = None
        if request.query_params.get("download"):
            filename = f"job{job.pk}-{task.type}{task.index}-attempt{task.attempt}{'.raw' if raw else ''}.log"
        body = log_reader.chunks(task.pk, lambda lines: "".join(f"{text}\n" for _seq, _stream, text in lines), raw=raw)
        return log_reader.streaming(body, "text/plain; charset=utf-8", filename)

    @extend_schema(
        responses={200: LogPageSerializer},
        parameters=[
            OpenApiParameter("since", int, description="return lines with seq greater than this cursor (default -1)"),
            OpenApiParameter(log_reader.RAW_PARAM, bool, description=_RAW_HELP),
        ],
        description=(
            "The task's log lines after a cursor, at most 2,000 a page, as JSON; pass `next` back as `since` to "
            "continue (what `tfdash logs -f` polls)."
        ),
    )
    @action(detail=True, methods=["get"], url_path=r"logs/(?P<task_id>\d+)/lines")
    def log_lines(self, request: Request, pk: str | None = None, task_id: str | None = None) -> Response:
        job = self.get_object()
        task = get_object_or_404(Task, pk=task_id, job=job)
        raw = request.query_params.get("since", "-1")
        if not _CURSOR.match(raw):
            return Response({"since": [f"{raw[:20]!r} is not a line number."]}, status=status.HTTP_400_BAD_REQUEST)
        since = int(raw)
        page = log_reader.page_after(task.pk, since, log_reader.PAGE_LINES)
        shown = log_reader.shown(page, raw=log_reader.wants_raw(request.query_params.get(log_reader.RAW_PARAM)))
        return Response(
            {
                "lines": [{"seq": seq, "stream": stream, "text": text} for seq, stream, text in shown],
                "next": page[-1][0] if page else since,
                "more": len(page) == log_reader.PAGE_LINES,
            }
        )
