"""The native task routes' requests and answers (/classify, /ner, /multiple-choice, /qa), and the bases
and text validation every protocol's wire types share. The examples are what /docs offers to "Try it out"."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)
from pydantic_core import PydanticCustomError

from app.api.scheduling import MAX_TIMEOUT_MS, PRIORITY_HEADER, TIMEOUT_HEADER
from app.engine.repository import MODEL_NAME

# Print nothing, and str.strip() keeps them (zero-width spaces and joiners, marks, the BOM, fillers):
# a text of only these and whitespace is as blank as an empty one.
INVISIBLE = "\u00ad\u034f\u061c\u115f\u1160\u180e\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\u3164\ufeff\uffa0"  # noqa: E501


def is_blank(value: str) -> bool:
    while (stripped := value.strip().strip(INVISIBLE)) != value:
        value = stripped
    return not value


def _check_text(value: str) -> str:
    if is_blank(value):
        raise ValueError("must not be empty or only whitespace or invisible characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates such as "\ud800" survive JSON decoding
        raise ValueError(f"contains a character that is not valid Unicode at position {e.start}") from None
    return value


# "Has a character that str.strip() keeps", spelt out: JSON Schema's \S (ECMA-262) and Python's
# whitespace differ (U+0085, U+001C-U+001F, U+FEFF). The schema then says what _check_text checks,
# so schema-driven clients (and fuzzers) send valid text.
SPACES = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_ONLY_WHITESPACE = f"[^{SPACES}{INVISIBLE.encode('unicode_escape').decode()}]"
Text = Annotated[
    str,
    AfterValidator(_check_text),
    Field(json_schema_extra={"minLength": 1, "pattern": NOT_ONLY_WHITESPACE}),
]
Aggregation = Literal["none", "simple", "first", "average", "max"]


def _json_integer(value: object) -> object:
    # `"top_k": true` or `"top_k": "2"` is an error, not a silent 1 or 2; 2.0 is a JSON integer.
    if isinstance(value, (bool, str)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


def _bounded_int(ge: int, le: int | None = None) -> Any:
    # Bounds before the validator: pydantic then writes them into the schema as minimum/maximum.
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_json_integer)]


ClassifyTopK = _bounded_int(1)
AnswerCount = _bounded_int(1, 20)
AnswerTokens = _bounded_int(1, 512)
StrideTokens = _bounded_int(0, 512)


ModelName = Annotated[
    str,
    Field(
        pattern=MODEL_NAME.pattern,
        description="The model to serve this request (a name from /models); default: the task's default",
    ),
]


class Strict(BaseModel):
    # A misspelt field ("txt") is an error that names it, not a silently ignored key.
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


TimeoutMs = Annotated[
    int,
    Field(
        ge=1,
        le=MAX_TIMEOUT_MS,
        description="Deadline in ms from when the body is read: work still queued then is dropped and the "
        f"request answers 504 (header: {TIMEOUT_HEADER})",
    ),
    BeforeValidator(_json_integer),
]
PriorityName = Annotated[
    Literal["high", "normal"],
    Field(
        description="high: batched before normal work younger than PRIORITY_AGING_MS "
        f"(header: {PRIORITY_HEADER})"
    ),
]


class Request(Strict):
    """A task request: the `model` field picks the model by name (see app/README.md); `timeout_ms` and
    `priority` schedule it (app/api/scheduling.py)."""

    model: ModelName | None = None
    timeout_ms: TimeoutMs | None = None
    priority: PriorityName | None = None


# ----------------------------------------------------------------------------- classify


class ClassifyInput(Strict):
    text: Text
    text_pair: Text | None = None


class ClassifyRequest(Request):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {"text": "this movie was great fun", "top_k": 2},
                {"inputs": [{"text": "a great film"}, {"text": "boring", "text_pair": "a terrible movie"}]},
            ],
            # What `_one_form` checks: a text, or a batch (with the pairs inside its elements).
            "oneOf": [
                {
                    "required": ["text"],
                    "properties": {"text": {"type": "string"}, "inputs": {"type": "null"}},
                },
                {
                    "required": ["inputs"],
                    "properties": {
                        "inputs": {"type": "array"},
                        "text": {"type": "null"},
                        "text_pair": {"type": "null"},
                    },
                },
            ],
        },
    )
    text: Text | None = Field(None, description="One text; or use `inputs` for a batch")
    text_pair: Text | None = Field(None, description="Optional second segment (sentence-pair tasks)")
    inputs: list[ClassifyInput] | None = Field(None, min_length=1, description="A batch of texts")
    top_k: ClassifyTopK | None = Field(None, description="Return only the k best labels (default: all)")

    @model_validator(mode="after")
    def _one_form(self) -> ClassifyRequest:
        if (self.text is None) == (self.inputs is None):
            raise ValueError("give either 'text' (one input) or 'inputs' (a batch), not both or neither")
        if self.inputs is not None and self.text_pair is not None:
            raise ValueError("'text_pair' goes inside each element of 'inputs' for a batch")
        return self


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResult(BaseModel):
    label: str
    score: float = Field(description="Probability of `label`; the predicted value for regression")
    scores: list[LabelScore] = Field(description="Labels by decreasing probability (sum to 1 when complete)")
    value: float | None = Field(None, description="Regression output (regression bundles only)")
    truncated: bool = Field(description="True when the text was cut to the model's max_seq_len")
    windows: int = Field(description="Windows averaged (CLASSIFY_LONG_TEXT=windows), else 1")


class ClassifyBatchResponse(BaseModel):
    results: list[ClassifyResult]


# ----------------------------------------------------------------------------- ner


class NERRequest(Request):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={"examples": [{"text": "John Smith lives in New York.", "aggregation": "first"}]},
    )
    text: Text
    aggregation: Aggregation = Field(
        "first",
        description="none: one entry per token; simple: join tokens; first/average/max: one label per "
        "word from its first / averaged / most confident sub-token",
    )


class EntityOut(BaseModel):
    entity: str = Field(description="Entity type (for aggregation=none, the token label such as B-PER)")
    text: str = Field(description="Equal to input[start:end]")
    start: int = Field(description="Character offset, inclusive")
    end: int = Field(description="Character offset, exclusive")
    score: float


class NERResponse(BaseModel):
    entities: list[EntityOut]
    windows: int = Field(description="Overlapping windows the text was split into")


# ----------------------------------------------------------------------------- multiple choice


class ChoiceRequest(Request):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "context": "The cat sat on the mat.",
                    "question": "Where did the cat sit?",
                    "choices": ["on the mat", "in the river", "at the house"],
                }
            ]
        },
    )
    context: Text
    question: Text | None = Field(None, description="Optional; a '_' in it is filled with each choice")
    choices: list[Text] = Field(min_length=2, description="At least two candidate answers")


class ChoiceResponse(BaseModel):
    best: int = Field(description="Index of the best choice")
    choice: str = Field(description="Text of the best choice")
    scores: list[float] = Field(description="Softmax over the choices, in request order")


# ----------------------------------------------------------------------------- qa


class QARequest(Request):
    model_config = ConfigDict(
        extra="forbid",
        protected_namespaces=(),
        json_schema_extra={
            "examples": [
                {
                    "question": "Where does John live?",
                    "context": "John Smith lives in Paris, the capital of France.",
                    "top_k": 1,
                }
            ]
        },
    )
    question: Text
    context: Text
    top_k: AnswerCount = Field(1, description="Number of answers")
    max_answer_len: AnswerTokens | None = Field(None, description="Longest answer in tokens")
    doc_stride: StrideTokens | None = Field(
        None, description="Tokens shared by consecutive context windows (default: the bundle's)"
    )
    handle_impossible_answer: StrictBool = Field(
        False, description="Let the empty answer compete (SQuAD 2.0)"
    )


class AnswerOut(BaseModel):
    text: str = Field(description="Equal to context[start:end]; empty for 'no answer'")
    start: int
    end: int
    score: float


class QAResponse(BaseModel):
    answers: list[AnswerOut]
    windows: int = Field(description="Context windows the model read")
