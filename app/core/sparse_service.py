"""TEI's /embed_sparse on a SPLADE bundle (task "sparse"): texts in, each text's nonzero
vocabulary weights out. The graph has already reduced the masked-LM logits to one weight per
vocabulary entry (model.bert.splade); a long text read in windows takes each weight's maximum over
them, as SPLADE's maximum over positions would."""

from __future__ import annotations

import numpy as np

from app.core.embed_service import EmbedService, fields
from app.core.task_service import ModelVersion, Timings
from app.http.retrieval_schemas import SparseEmbedResponse
from app.http.schemas import EmbedTextsRequest
from app.settings import Settings
from processing.sparse import as_pairs
from processing.tokenizer import Encoding


class SparseEmbedService(EmbedService):
    """EmbedService's texts-to-vectors path (limits, prompts, windows), with SPLADE's vectors."""

    task = "sparse"

    def __init__(self, bundle: ModelVersion, settings: Settings):
        super().__init__(bundle, settings)
        self.pooling = "max"  # across windows: SPLADE's maximum over positions

    def width(self) -> int:
        return self.tokenizer.vocab_size  # the graph's vocab axis is symbolic in the manifest

    def row_vector(self, outputs: dict[str, np.ndarray], encoding: Encoding) -> np.ndarray:
        return outputs["sparse"]

    async def __call__(self, request: EmbedTextsRequest, timings: Timings) -> SparseEmbedResponse:
        done = await self.embed(fields("inputs", request.inputs), "inputs", request, timings, normalize=False)
        with timings.measure("postprocess"):
            reply = SparseEmbedResponse.model_validate([as_pairs(v) for v in done.vectors])
        reply._headers = self._headers(done)
        return reply
