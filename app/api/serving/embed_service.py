"""Sentence embeddings for three protocols (TEI /embed and /similarity, OpenAI /v1/embeddings):
texts to vectors through the batcher, pooled by processing/embed.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.api.openai_schemas import (
    EmbeddingData,
    EmbeddingUsage,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
)
from app.api.serving.task_service import (
    ModelVersion,
    TaskService,
    Timings,
    check_chars,
    check_items,
    cpu_step,
    sequence_items,
)
from app.api.tei_schemas import (
    EmbedAllResponse,
    EmbedOptions,
    EmbedRequest,
    EmbedResponse,
    EmbedTextsRequest,
    SimilarityRequest,
    SimilarityResponse,
)
from app.engine.protocol import EngineClient
from app.errors import InputTooLong, InvalidInput
from app.settings import Settings
from export.bundle import dense_layers
from processing import embed as embed_proc
from processing.tokenizer import Encoding


@dataclass
class Embedded:
    """Texts turned into vectors, and what happened on the way."""

    vectors: np.ndarray  # [texts, hidden], float32
    tokens: int  # tokens the model read, [CLS] and [SEP] included
    truncated: list[int]  # indices of the texts cut to max_seq_len
    windows: dict[int, int]  # index -> windows, for texts read in several windows


def fields(name: str, value: str | list[str]) -> dict[str, str]:
    """A request field holding one text or a list, as field name -> text ("inputs.3")."""
    return {name: value} if isinstance(value, str) else {f"{name}.{i}": text for i, text in enumerate(value)}


class EmbedService(TaskService):
    """Sentence embeddings for three protocols (TEI /embed and /similarity, OpenAI /v1/embeddings):
    each request becomes texts, the texts become vectors (`embed`), the vectors the protocol's reply."""

    task = "embed"
    output: str | None = None  # None: the engine pools last_hidden_state; else a graph output as it is

    def __init__(self, bundle: ModelVersion, settings: Settings, engine: EngineClient):
        super().__init__(bundle, settings, engine)
        pooling = self.manifest.pooling or {}
        self.pooling = pooling.get("mode", "mean")
        self.dimensions = self.width()
        self.long_text = settings.classify_long_text
        # sentence-transformers' prompts (config_sentence_transformers.json), saved by export.
        self.prompts: dict[str, str] = self.manifest.preprocessing.get("prompts") or {}
        self.default_prompt: str | None = self.manifest.preprocessing.get("default_prompt_name")
        # sentence-transformers' Dense modules after pooling (read and checked against their sha256).
        self.dense = dense_layers(bundle.path, self.manifest) if pooling.get("dense") else []

    def width(self) -> int:
        """The vectors' size: the pooling's (after any Dense layers), else the graph's last axis."""
        return int((self.manifest.pooling or {}).get("dimensions") or self.manifest.outputs[0]["shape"][-1])

    def with_prompt(self, texts: dict[str, str], name: str | None) -> dict[str, str]:
        """Each text behind the prompt `name` asks for (TEI's prompt_name), else the model's default."""
        name = self.default_prompt if name is None else name
        if name is None:
            return texts
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InvalidInput(
                f"model {self.manifest.name} has no prompt {name!r}; its prompts: {known}", "prompt_name"
            )
        return {field: self.prompts[name] + text for field, text in texts.items()}

    def _encode(self, texts: dict[str, str], truncate: bool | None, side: str) -> list[list[Encoding]]:
        long_text = "truncate" if truncate is not None else self.long_text
        out = []
        for field, text in texts.items():
            encodings = embed_proc.encode_for_embed(
                self.tokenizer, text, self.max_seq_len, long_text, self.window_overlap, side
            )
            if truncate is False and encodings[0].truncated:
                tokens = len(self.tokenizer.tokenize(text)) + 2
                raise InputTooLong(
                    f"{field} has {tokens} tokens and the model reads at most {self.max_seq_len}: "
                    "send truncate: true to cut it, or leave truncate unset for the server's rule",
                    field,
                )
            out.append(encodings)
        return out

    async def embed(
        self, texts: dict[str, str], batch: str, options: EmbedOptions, timings: Timings, normalize: bool
    ) -> Embedded:
        """The vectors of `texts` (request field name -> text; `batch` names the list), in order,
        normalized if asked."""
        texts = self.with_prompt(texts, options.prompt_name)
        check_items(len(texts), self.settings.max_batch_items, batch, "texts")
        for field, text in texts.items():
            check_chars(text, self.settings.max_text_chars, field, "MAX_TEXT_CHARS")
        side = options.truncation_direction.lower()
        with timings.measure("tokenize"):
            chars = sum(map(len, texts.values()))
            timings.chars += chars
            encoded = await cpu_step(chars, self._encode, texts, options.truncate, side)
        items = sequence_items([e for encodings in encoded for e in encodings])
        # The engine pools each sequence over its own tokens: hidden states never leave it.
        reduce = self.pooling if self.output is None else None
        results = await self.infer(items, timings, reduce=reduce)
        key = self.output or "pooled"
        with timings.measure("postprocess"):
            vectors, cursor = [], 0
            for encodings in encoded:
                pooled = [r.outputs[key] for r in results[cursor : cursor + len(encodings)]]
                cursor += len(encodings)
                vectors.append(
                    embed_proc.pool_windows(np.stack(pooled), [len(e) for e in encodings], self.pooling)
                )
            matrix = np.stack(vectors)
            if self.dense:
                matrix = embed_proc.apply_dense(matrix, self.dense)
            if normalize:
                matrix = embed_proc.normalize(matrix)
        return Embedded(
            vectors=matrix,
            tokens=sum(len(e) for encodings in encoded for e in encodings),
            truncated=[i for i, encodings in enumerate(encoded) if encodings[0].truncated],
            windows={i: len(encodings) for i, encodings in enumerate(encoded) if len(encodings) > 1},
        )

    @staticmethod
    def _note(done: Embedded, timings: Timings) -> None:
        timings.truncated, timings.windows = done.truncated, done.windows

    async def __call__(self, request: EmbedRequest, timings: Timings) -> EmbedResponse:
        """TEI's /embed."""
        done = await self.embed(
            fields("inputs", request.inputs), "inputs", request, timings, request.normalize
        )
        reply = EmbedResponse.model_construct(done.vectors.tolist())  # floats already: no validation pass
        self._note(done, timings)
        return reply

    async def embed_all(self, request: EmbedTextsRequest, timings: Timings) -> EmbedAllResponse:
        """TEI's /embed_all: every token's vector (the last hidden state), special tokens included.
        One window per text: a long text is cut to max_seq_len (truncate unset or true) or refused."""
        texts = self.with_prompt(fields("inputs", request.inputs), request.prompt_name)
        check_items(len(texts), self.settings.max_batch_items, "inputs", "texts")
        for field, text in texts.items():
            check_chars(text, self.settings.max_text_chars, field, "MAX_TEXT_CHARS")
        truncate = True if request.truncate is None else request.truncate
        side = request.truncation_direction.lower()
        with timings.measure("tokenize"):
            timings.chars += sum(map(len, texts.values()))
            encoded = await cpu_step(timings.chars, self._encode, texts, truncate, side)
        encodings = [e for windows in encoded for e in windows]
        # The one route whose answer is the token states themselves: they leave the engine unpooled.
        results = await self.infer(sequence_items(encodings), timings)
        with timings.measure("postprocess"):
            states = [
                r.outputs["last_hidden_state"][: len(e)] for e, r in zip(encodings, results, strict=True)
            ]
            reply = EmbedAllResponse.model_construct([s.tolist() for s in states])
        timings.truncated = [i for i, e in enumerate(encodings) if e.truncated]
        return reply

    async def openai(self, request: OpenAIEmbeddingRequest, timings: Timings) -> OpenAIEmbeddingResponse:
        """OpenAI's /v1/embeddings: normalized vectors, as OpenAI's are."""
        if request.dimensions is not None and request.dimensions != self.dimensions:
            raise InvalidInput(
                f"model {self.manifest.name} gives {self.dimensions}-dimensional vectors and cannot shorten "
                f"them: leave dimensions unset or send {self.dimensions}",
                "dimensions",
            )
        done = await self.embed(fields("input", request.input), "input", request, timings, normalize=True)
        encode = embed_proc.to_base64 if request.encoding_format == "base64" else np.ndarray.tolist
        reply = OpenAIEmbeddingResponse(
            data=[EmbeddingData(index=i, embedding=encode(v)) for i, v in enumerate(done.vectors)],
            model=self.bundle.name,
            usage=EmbeddingUsage(prompt_tokens=done.tokens, total_tokens=done.tokens),
        )
        self._note(done, timings)
        return reply

    async def similarity(self, request: SimilarityRequest, timings: Timings) -> SimilarityResponse:
        """TEI's /similarity: the cosine of the source sentence with each sentence."""
        texts = {"inputs.source_sentence": request.inputs.source_sentence}
        texts.update(fields("inputs.sentences", request.inputs.sentences))
        done = await self.embed(texts, "inputs.sentences", request, timings, normalize=True)
        reply = SimilarityResponse(embed_proc.cosine_scores(done.vectors[0], done.vectors[1:]))
        self._note(done, timings)
        return reply
