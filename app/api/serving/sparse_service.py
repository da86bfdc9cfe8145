"""TEI's /embed_sparse on a SPLADE bundle (task "sparse"): texts in, each text's nonzero
vocabulary weights out. The graph has already reduced the masked-LM logits to one weight per
vocabulary entry (model.bert.splade); a long text read in windows takes each weight's maximum over
them, as SPLADE's maximum over positions would."""

from __future__ import annotations

from app.api.serving.embed_service import EmbedService, fields
from app.api.serving.task_service import Timings
from app.api.tei_schemas import EmbedTextsRequest, SparseEmbedResponse
from app.engine.protocol import EngineClient
from app.settings import Settings
from processing.sparse import as_pairs


class SparseEmbedService(EmbedService):
    """EmbedService's texts-to-vectors path (limits, prompts, windows), with SPLADE's vectors."""

    task = "sparse"
    output = "sparse"  # the graph's [vocab] row per sequence: already reduced, nothing to pool

    def __init__(self, bundle, settings: Settings, engine: EngineClient):
        super().__init__(bundle, settings, engine)
        self.pooling = "max"  # across windows: SPLADE's maximum over positions

    def width(self) -> int:
        return self.tokenizer.vocab_size  # the graph's vocab axis is symbolic in the manifest

    async def __call__(self, request: EmbedTextsRequest, timings: Timings) -> SparseEmbedResponse:
        done = await self.embed(fields("inputs", request.inputs), "inputs", request, timings, normalize=False)
        with timings.measure("postprocess"):
            reply = SparseEmbedResponse.model_validate([as_pairs(v) for v in done.vectors])
        self._note(done, timings)
        return reply
