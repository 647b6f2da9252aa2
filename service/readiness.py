"""Whether the service can answer image requests, and if not why: GET /readyz reports it, and
every image route refuses with 503 model_unavailable until both models are loaded and warmed up
(every batch shape run once, so the first requests pay no per-shape provider cost), and while the
model host they run in is down, hung or warming up again (`facegate serve --workers N`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict

from service.core.decision import default_far_fallback
from service.core.errors import ModelUnavailable
from service.core.models.manifest import far_key
from service.core.models.model_set import ModelSet


class Readiness:
    def __init__(self, models: ModelSet, default_far: str = "1e-3"):
        self.models = models
        self.default_far = default_far  # FACEGATE_DEFAULT_FAR: /readyz says when the embedder lacks its threshold
        self.warmed = threading.Event()
        self.warmup_error: str | None = None
        self.serving: Callable[[], dict] = dict  # batch shapes, threads, the model host: what the engine runs with now, for /readyz
        self.host_problem: Callable[[], str | None] = lambda: None  # why the model host cannot take runs now (HostedModels.problem)

    @property
    def loaded(self) -> bool:
        # a cohort the operator named but that cannot be used would silently change every decision
        return (
            self.models.detector is not None
            and self.models.embedder is not None
            and not any(p.model == "cohort" for p in self.models.problems)
        )

    @property
    def ready(self) -> bool:
        return self.loaded and self.warmed.is_set() and self.warmup_error is None and self.host_problem() is None

    def warmup_done(self, error: str | None = None) -> None:
        self.warmup_error = error
        self.warmed.set()

    def require(self) -> None:
        if self.ready:
            return
        if not self.loaded:
            missing = ", ".join(f"{p.model} {p.name!r}" for p in self.models.problems)
            raise ModelUnavailable(f"the service has no usable {missing}; see GET /readyz for the fix")
        if self.warmup_error:
            raise ModelUnavailable(f"the models failed their warm-up: {self.warmup_error}; see GET /readyz")
        if not self.warmed.is_set():
            raise ModelUnavailable("the models are warming up (every batch shape runs once at start-up); retry shortly", retry_after=1)
        if (problem := self.host_problem()) is not None:  # None: the host came back meanwhile
            raise ModelUnavailable(f"{problem}; retry shortly", retry_after=1)

    def _uncalibrated(self) -> list[dict]:
        """An embedder without thresholds serves, but every decision at a default FAR is a 422: say so
        (it does not make the service unready: explicit thresholds still work)."""
        embedder = self.models.embedder
        if embedder is None:
            return []
        if embedder.manifest.thresholds:
            return self._default_far_fallback()
        return [
            {
                "model": "embedder",
                "name": embedder.manifest.name,
                "error": (
                    "no calibrated thresholds: /verify and /identify answer 422 unknown_far unless a request gives an explicit threshold"
                ),
                "fix": f"facegate calibrate {embedder.manifest.name}.json (its run's held-out identities, or --data ALIGNED_FOLDERS)",
            }
        ]

    def _host_problems(self) -> list[dict]:
        problem = self.host_problem()
        if problem is None:
            return []
        return [
            {
                "model": "model host",
                "name": "facegate serve",
                "error": problem,
                "fix": "none if it passes within seconds (its supervisor restarts it); else the model host's log says why",
            }
        ]

    def _default_far_fallback(self) -> list[dict]:
        """An embedder calibrated on few people may lack FACEGATE_DEFAULT_FAR's threshold: requests naming
        no far are decided at another FAR (service/core/decision.py), which /readyz says once here."""
        assert self.models.embedder is not None
        manifest = self.models.embedder.manifest
        try:
            fallback = default_far_fallback(manifest, self.default_far)
        except ValueError:
            return []  # a malformed setting is each request's 422 invalid_parameters
        if fallback is None:
            return []
        default = far_key(self.default_far)
        return [
            {
                "model": "embedder",
                "name": manifest.name,
                "error": (
                    f"no threshold for the default FAR {default} (FACEGATE_DEFAULT_FAR): /verify without far decides at FAR "
                    f"{fallback} and says so in its `warning`"
                ),
                "fix": (
                    f"facegate calibrate {manifest.name}.json on more held-out people (its report says how many pairs each FAR "
                    f"needs), or set FACEGATE_DEFAULT_FAR={fallback}"
                ),
            }
        ]

    def report(self) -> dict:
        models = {}
        for role, loaded in (("detector", self.models.detector), ("embedder", self.models.embedder)):
            if loaded:
                models[role] = {
                    "name": loaded.manifest.name,
                    "version": loaded.manifest.version,
                    "sha256": loaded.manifest.file.sha256,
                    "providers": loaded.session.get_providers(),
                    "provider_options": loaded.session.get_provider_options(),
                }
        warmup = "failed" if self.warmup_error else "done" if self.warmed.is_set() else "running" if self.loaded else "not started"
        return {
            "ready": self.ready,
            "warmup": warmup,
            "models": models,
            "serving": self.serving(),
            "problems": [asdict(p) for p in self.models.problems]
            + (
                [
                    {
                        "model": "engine",
                        "name": "warm-up",
                        "error": self.warmup_error,
                        "fix": "lower FACEGATE_BATCH_SIZES / FACEGATE_DETECT_BATCH_SIZES or free device memory",
                    }
                ]
                if self.warmup_error
                else []
            )
            + self._host_problems()
            + self._uncalibrated(),
        }
