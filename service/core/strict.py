"""The one strict pydantic base: an unknown field is an error, never silently dropped (manifests,
request options and bodies, the training config alike)."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
