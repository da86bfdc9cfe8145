"""text-embeddings-inference's requests and answers: /embed and /similarity (EmbedService), /rerank
and /predict (onto the classify service, app/api/serving/rerank_service.py), /embed_sparse (SPLADE term
weights) and /embed_all (a vector per token)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    RootModel,
    StrictBool,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.api.native_schemas import (
    NOT_ONLY_WHITESPACE,
    ClassifyTopK,
    Request,
    Strict,
    Text,
    _check_text,
)

# ----------------------------------------------------------------------------- embeddings
# Three protocols, one service (EmbedService): text-embeddings-inference's /embed and /similarity,
# and OpenAI's /v1/embeddings (openai_schemas.py, on EmbedOptions and Texts). What happened to a long
# input is in the X-Truncated-Inputs and X-Windowed-Inputs headers, since TEI's answers are bare lists.

TruncationSide = Literal["right", "left", "Right", "Left"]  # TEI spells them both ways


def _one_or_many(value: object) -> object:
    # One text is a list of one: errors then name "inputs.0", as the service does.
    if isinstance(value, str):
        return [value]
    # OpenAI also takes token-id arrays; a bundle's vocabulary is not OpenAI's, so say so plainly.
    if isinstance(value, list) and any(isinstance(v, (int, list)) and not isinstance(v, bool) for v in value):
        raise PydanticCustomError(
            "token_ids_unsupported", "token-id arrays are not supported: send a string or a list of strings"
        )
    return value


_TEXT_SCHEMA = {"type": "string", "minLength": 1, "pattern": NOT_ONLY_WHITESPACE}
Texts = Annotated[
    list[Text],
    BeforeValidator(_one_or_many),
    Field(min_length=1),
    WithJsonSchema({"anyOf": [_TEXT_SCHEMA, {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1}]}),
]


class InferenceParameters(BaseModel):
    """Hugging Face's Inference API sends a task's options apart, `{"inputs": ..., "parameters": {...}}`,
    and huggingface_hub's InferenceClient always does (`{}` when none is set). They are the route's own
    fields, lifted beside `inputs`; one the route lacks is refused under its full name
    (`parameters.dimensions`), where TEI would silently drop them all."""

    # Always None once validated: the validator has lifted its keys. Declared for the schema.
    parameters: Annotated[
        None,
        WithJsonSchema(
            {
                "type": "object",
                "description": "This route's options, given apart (Hugging Face's Inference API form)",
            }
        ),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _lift_parameters(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "parameters" not in data:
            return data
        lifted = {key: value for key, value in data.items() if key != "parameters"}
        parameters = data["parameters"]
        if parameters is None:
            return lifted
        if not isinstance(parameters, dict):
            raise PydanticCustomError(
                "parameters_type", "parameters must be an object of the route's options"
            )
        for key, value in parameters.items():
            # An unknown key stays under its dotted name, which extra="forbid" then refuses by name.
            own = key in cls.model_fields and key not in ("inputs", "parameters")
            name = key if own else f"parameters.{key}"
            if name in lifted and lifted[name] != value:
                raise PydanticCustomError(
                    "parameters_conflict", "{key} is given twice, with different values", {"key": key}
                )
            lifted[name] = value
        return lifted


class EmbedOptions(Request):
    truncate: StrictBool | None = Field(
        None,
        description="true: cut long inputs to the model's max_seq_len; false: refuse them (413, as TEI); "
        "unset: the server's rule for long texts (CLASSIFY_LONG_TEXT: truncate, or windows pooled "
        "into one vector)",
    )
    truncation_direction: TruncationSide = Field(
        "right", description="Which end truncation keeps: right cuts the end"
    )
    prompt_name: str | None = Field(
        None,
        description="A prompt of the model (config_sentence_transformers.json, e.g. e5's query) before each "
        "text; unset: the model's default prompt, if it has one",
    )


class EmbedTextsRequest(EmbedOptions, InferenceParameters):
    """TEI's /embed_sparse and /embed_all; /embed adds `normalize`."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [{"inputs": "What is deep learning?"}, {"inputs": ["a cat", "a dog"]}]
        },
    )
    inputs: Texts = Field(description="One text, or a list of texts")


class EmbedRequest(EmbedTextsRequest):
    normalize: StrictBool = Field(True, description="L2-normalize each vector (TEI's default)")


class EmbedResponse(RootModel[list[list[float]]]):
    """One vector per input, in order (TEI's bare list)."""


class SimilarityInputs(Strict):
    source_sentence: Text
    sentences: list[Text] = Field(min_length=1)


class SimilarityRequest(EmbedOptions, InferenceParameters):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "inputs": {
                        "source_sentence": "A man is playing a guitar.",
                        "sentences": ["Someone plays an instrument.", "A woman is cooking."],
                    }
                }
            ]
        },
    )
    inputs: SimilarityInputs


class SimilarityResponse(RootModel[list[float]]):
    """The cosine similarity of the source sentence with each sentence, in order (TEI's bare list)."""


# ----------------------------------------------------------------------------- rerank, predict
# Onto the classify service; Infinity's /v1/rerank is in cohere_schemas.py.


class PairOptions(Request):
    raw_scores: StrictBool = Field(
        False,
        description="The model's logit (of the positive label) instead of a probability: for a "
        "one-output model its value rather than its sigmoid",
    )
    truncate: StrictBool | None = Field(
        None,
        description="true: cut long inputs to the model's max_seq_len (a pair's longer segment first); "
        "false: refuse them (413, as TEI); unset: the /classify rule (pairs are cut; single texts follow "
        "CLASSIFY_LONG_TEXT)",
    )
    # TEI's field; left is refused: /classify cuts an input from its end (a pair's longer segment first).
    truncation_direction: Literal["right", "Right"] = Field(
        "right", description="Only right: inputs are cut from their end, as /classify cuts them"
    )


class RerankRequest(PairOptions, InferenceParameters):
    """text-embeddings-inference's /rerank."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "query": "What is deep learning?",
                    "texts": ["Deep learning is a kind of machine learning.", "Paris is in France."],
                }
            ]
        },
    )
    query: Text
    texts: list[Text] = Field(min_length=1, description="The texts to rank (at most MAX_BATCH_ITEMS)")
    return_text: StrictBool = Field(False, description="Give each text back beside its score")


class Rank(BaseModel):
    index: int = Field(description="Position in `texts`")
    score: float = Field(description="Relevance to the query (see raw_scores)")
    text: str | None = Field(None, description="The text, with return_text")


class RerankResponse(RootModel[list[Rank]]):
    """The texts by decreasing score (TEI's bare list)."""

    # What happened to long inputs (X-Truncated-Inputs); routes.serve sends them.


# ----------------------------------------------------------------------------- predict

_SEQUENCE_SCHEMA = {"type": "array", "items": _TEXT_SCHEMA, "minItems": 1, "maxItems": 2}
SHAPES = "a text, a pair [text, text_pair], or a batch of them [[text], [text, text_pair], ...]"


def _check_sequence(value: list[str], where: str) -> None:
    if not 1 <= len(value) <= 2:
        raise ValueError(
            f"{where} has {len(value)} strings: a list of strings is one text [a] or one pair [a, b]"
            + ("; send a batch as a list of lists, [[a], [b, c]]" if where == "inputs" else "")
        )
    for n, text in enumerate(value):
        try:
            _check_text(text)
        except ValueError as e:
            raise ValueError(f"{where}.{n}: {e}") from None


def _check_predict_inputs(value: str | list[str] | list[list[str]]) -> Any:
    if isinstance(value, str):
        _check_text(value)
    elif not value:
        raise ValueError(f"must be {SHAPES}")
    elif isinstance(value[0], str):
        _check_sequence(value, "inputs")  # type: ignore[arg-type]
    else:
        for n, sequence in enumerate(value):
            _check_sequence(sequence, f"inputs.{n}")  # type: ignore[arg-type]
    return value


PredictInputs = Annotated[
    str | list[str] | list[list[str]],
    AfterValidator(_check_predict_inputs),
    WithJsonSchema(
        {
            "anyOf": [
                _TEXT_SCHEMA,
                _SEQUENCE_SCHEMA,
                {"type": "array", "items": _SEQUENCE_SCHEMA, "minItems": 1},
            ],
            "description": SHAPES.capitalize(),
        }
    ),
]


class PredictRequest(PairOptions, InferenceParameters):
    """text-embeddings-inference's /predict, with the `model` field of every route here."""

    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {"inputs": "this movie was great fun"},
                {"inputs": [["a great film"], ["boring", "a terrible movie"]]},
            ]
        },
    )
    inputs: PredictInputs
    top_k: ClassifyTopK | None = Field(
        None, description="Only the k best labels per input (Hugging Face's text-classification option)"
    )

    @property
    def batch(self) -> bool:
        return isinstance(self.inputs, list) and isinstance(self.inputs[0], list)

    def sequences(self) -> tuple[list[tuple[str, str | None]], list[tuple[str, str]]]:
        """Each input as (text, text_pair) and the fields they came from, for errors."""
        if isinstance(self.inputs, str):
            return [(self.inputs, None)], [("inputs", "inputs")]
        forms = self.inputs if self.batch else [self.inputs]
        prefixes = [f"inputs.{n}." for n in range(len(forms))] if self.batch else ["inputs."]
        pairs = [(form[0], form[1] if len(form) > 1 else None) for form in forms]
        return pairs, [(f"{prefix}0", f"{prefix}1") for prefix in prefixes]  # type: ignore[misc]


class Prediction(BaseModel):
    score: float = Field(
        description="Probability of the label (raw_scores: its logit; regression: the value)"
    )
    label: str


class PredictResponse(RootModel[list[Prediction] | list[list[Prediction]]]):
    """Every label by decreasing score; for a batch, one such list per input (TEI's bare lists)."""

    # What happened to long inputs (X-Truncated-Inputs, X-Windowed-Inputs); routes.serve sends them.


# ----------------------------------------------------------------------------- embed_sparse, embed_all


class SparseValue(BaseModel):
    index: int = Field(description="The vocabulary id (the tokenizer's) the weight belongs to")
    value: float = Field(description="Its weight: the maximum over the text's tokens of log(1 + relu(logit))")


class SparseEmbedResponse(RootModel[list[list[SparseValue]]]):
    """Per input, in order, its nonzero weights by increasing index (TEI's shape)."""


class EmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input, one vector per token the model read (special tokens included), in order: the
    encoder's last hidden states, for late interaction (ColBERT-style scoring)."""
