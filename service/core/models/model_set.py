"""The service's two models, loaded once from settings. A model that cannot be loaded is recorded
as a problem with its fix instead of stopping the process: the service starts and /readyz says why."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.core.errors import ModelError
from service.core.models.cohort import Cohort
from service.core.models.files import LoadedModel, load_model
from service.core.models.manifest import EmbedderKey
from service.core.models.providers import Runtime
from service.core.settings import Settings

FIXES = {
    "detector": (
        "the detector ships beside its manifest in FACEGATE_MODELS_DIR (models/): "
        "restore it from the repository or the image, then check it with `facegate models list`"
    ),
    "cohort": "rebuild the cohort for this embedder with `facegate calibrate-cohort`, or unset FACEGATE_COHORT",
    "embedder": (
        "set FACEGATE_EMBEDDER to an embedder manifest (a name in FACEGATE_MODELS_DIR or a path to its .json) "
        "whose model file sits beside it or in FACEGATE_MODEL_CACHE"
    ),
}


@dataclass(frozen=True)
class Problem:
    model: str  # the role: detector or embedder
    name: str
    error: str
    fix: str


@dataclass(frozen=True)
class ModelSet:
    detector: LoadedModel | None
    embedder: LoadedModel | None
    problems: list[Problem] = field(default_factory=list)
    cohort: Cohort | None = None  # FACEGATE_COHORT, checked against the embedder

    @property
    def embedder_key(self) -> EmbedderKey | None:
        return EmbedderKey.of(self.embedder.manifest) if self.embedder else None

    def require(self, *roles: str) -> None:
        """Raise the load error of the first of `roles` that is missing (the CLI's start-up check)."""
        for problem in self.problems:
            if problem.model in roles:
                raise ModelError(problem.error)


def load_models(settings: Settings) -> ModelSet:
    loaded: dict[str, LoadedModel | None] = {}
    problems = []
    runtime = Runtime.from_settings(settings)
    for role, name in (("detector", settings.detector), ("embedder", settings.embedder)):
        try:
            detector = role == "detector"
            loaded[role] = load_model(
                name,
                settings.models_dir,
                settings.model_cache,
                runtime=runtime,
                free_batch_dim=detector,
                free_sizes=tuple(settings.detect_sizes) if detector else (),
                feed_color="BGR" if detector else "RGB",  # the detector sees decoded BGR images, the embedder aligned RGB crops
            )
        except ModelError as exc:
            loaded[role] = None
            problems.append(Problem(role, name, str(exc), FIXES[role]))
    return with_cohort(settings, loaded["detector"], loaded["embedder"], problems)


def with_cohort(settings: Settings, detector: LoadedModel | None, embedder: LoadedModel | None, problems: list[Problem]) -> ModelSet:
    """The model set, with FACEGATE_COHORT loaded against the embedder (a problem when it does not fit)."""
    cohort = None
    if settings.cohort is not None and embedder is not None:
        try:
            cohort = Cohort.load(settings.cohort, embedder.manifest)
        except ModelError as exc:
            problems = [*problems, Problem("cohort", str(settings.cohort), str(exc), FIXES["cohort"])]
    return ModelSet(detector, embedder, problems, cohort)
