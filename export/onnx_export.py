"""Trace one of our task heads (model.bert.TASK_HEADS) to ONNX with dynamic axes."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from model.architectures import ARCHITECTURES, UnsupportedArchitecture, architecture, head_type, hf_head_names
from model.config import BertConfig
from processing.tasks import MODEL_AXES
from processing.tasks import TASKS as TASK_SPECS

from .bundle import INPUT_NAMES, TASKS, task_io

# The TorchScript exporter (dynamo=False): ORT's transformer optimizer recognises the
# attention / LayerNorm / Gelu patterns it emits. Opset 17 is the first with LayerNormalization.
DEFAULT_OPSET = 17
# Traced shape: deliberately odd, and never one of the verification shapes.
TRACE_BATCH, TRACE_CHOICES, TRACE_SEQ = 2, 3, 11


class ExportError(RuntimeError):
    """The export could not be produced or failed its checks."""


class OnnxHead(nn.Module):
    """Plain-tensor wrapper around a head: the HeadOutput dataclass cannot be traced as output."""

    def __init__(self, model: nn.Module, task: str):
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor):
        out = self.model(input_ids, attention_mask, token_type_ids)
        # The graph's outputs are the registry's, named as the HeadOutput fields that hold them.
        values = tuple(getattr(out, name) for name, _ in TASK_SPECS[self.task].outputs)
        return values if len(values) > 1 else values[0]


# A `transformers` checkpoint names its head class in config.json `architectures`: for every
# architecture we load (model/architectures.py), its head per task (RobertaForTokenClassification),
# and its bare encoder (RobertaModel: a sentence encoder).
ARCHITECTURE_TASKS = {
    name: task for arch in ARCHITECTURES.values() for name, task in hf_head_names(arch).items()
}


def checkpoint_task(config: BertConfig, where: str, requested: str | None = None) -> str:
    """The task head a checkpoint was fine-tuned for: `requested` (--task), else config.task (our
    trainer's), else what `architectures` names. Refuses a request that contradicts the config."""
    architectures = list(config.extra.get("architectures") or [])
    declared = {ARCHITECTURE_TASKS[a] for a in architectures if a in ARCHITECTURE_TASKS}
    if config.task is not None:
        declared.add(config.task)
    if requested is not None:
        if requested not in TASKS:
            raise ExportError(f"--task {requested!r} is not one of {', '.join(TASKS)}")
        if declared and requested not in declared:
            raise ExportError(
                f"{where}/config.json says the head is for {sorted(declared)} (architectures "
                f"{architectures}, task {config.task!r}), not --task {requested}"
            )
        return requested
    if config.task is not None and config.task not in TASKS:
        raise ExportError(
            f"{where}/config.json has task {config.task!r}; export supports {', '.join(TASKS)} "
            "(pass --task to name the fine-tuned head)"
        )
    if len(declared) == 1:
        return declared.pop()
    known = ", ".join(f"{a} -> {t}" for a, t in ARCHITECTURE_TASKS.items())
    named = architectures or "absent"
    raise ExportError(
        f"cannot tell which task head {where} holds: config.json `architectures` is {named} "
        f"and `task` is {config.task!r} (known architectures: {known}); pass --task "
        f"{{{','.join(TASKS)}}} to name it"
    )


def check_supported(config: BertConfig, where: str) -> None:
    """Refuse configs we do not implement (model/architectures.py), instead of exporting something else."""
    try:
        architecture(config.model_type, where)
    except UnsupportedArchitecture as e:
        raise ExportError(str(e)) from e
    position = config.extra.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise ExportError(
            f"{where}/config.json has position_embedding_type {position!r}; only 'absolute' is implemented"
        )


def load_head(
    checkpoint_dir: str | Path, task: str | None = None, pooling: str | None = None
) -> tuple[nn.Module, BertConfig]:
    """Load the checkpoint with its task head (see checkpoint_task), in eval mode; config.task is set
    (and config.pooling, for a sentence encoder, when `pooling` names it)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / "config.json").is_file():
        raise ExportError(f"{checkpoint_dir} has no config.json: not a checkpoint directory")
    config = BertConfig.from_pretrained(checkpoint_dir)
    check_supported(config, str(checkpoint_dir))
    task = checkpoint_task(config, str(checkpoint_dir), task)
    overrides = {"pooling": pooling} if pooling is not None else {}
    model = head_type(config.model_type, task).from_pretrained(checkpoint_dir, task=task, **overrides)
    if getattr(model, "missing_keys", None):
        raise ExportError(
            f"{checkpoint_dir}: weights missing for {', '.join(model.missing_keys)}; exporting would ship "
            "randomly initialised parameters"
        )
    return model.eval(), model.config


def example_inputs(
    task: str, batch: int, seq: int, vocab_size: int, choices: int = 1, seed: int = 0
) -> dict[str, Tensor]:
    shape = (batch, choices, seq) if TASK_SPECS[task].choices else (batch, seq)
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, shape, generator=gen)
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "token_type_ids": torch.zeros_like(input_ids),
    }


def dynamic_axes(task: str, config: BertConfig) -> dict[str, dict[int, str]]:
    inputs, outputs = task_io(task, config.num_labels, config.hidden_size)
    axes = {}
    for spec in inputs + outputs:
        axes[spec["name"]] = {i: dim for i, dim in enumerate(spec["shape"]) if isinstance(dim, str)}
    return axes


def export_onnx(model: nn.Module, config: BertConfig, path: Path, opset: int = DEFAULT_OPSET) -> None:
    """Write the fp32 graph for `model` (a TASK_HEADS instance) to `path`."""
    if opset < 17:
        raise ExportError(f"opset {opset} is too old: LayerNormalization needs opset >= 17")
    task = config.task
    wrapper = OnnxHead(model, task).eval()
    inputs = example_inputs(task, TRACE_BATCH, TRACE_SEQ, config.vocab_size, choices=TRACE_CHOICES)
    _, outputs = task_io(task, config.num_labels, config.hidden_size)
    with torch.no_grad(), warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of dynamo but still the one ORT fuses best.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            tuple(inputs[n] for n in INPUT_NAMES),
            str(path),
            dynamo=False,
            opset_version=opset,
            input_names=list(INPUT_NAMES),
            output_names=[o["name"] for o in outputs],
            dynamic_axes=dynamic_axes(task, config),
            do_constant_folding=True,
        )
    check_graph(path, task)


def graph_inputs(task: str, config, graph: Path) -> list[dict]:
    """The task's input specs that the graph reads: a model with one token type (RoBERTa) or none
    (DistilBERT) takes no token_type_ids, and the service feeds a graph only what it takes."""
    import onnx

    names = {i.name for i in onnx.load(str(graph), load_external_data=False).graph.input}
    return [spec for spec in task_io(task, config.num_labels, config.hidden_size)[0] if spec["name"] in names]


def check_graph(path: Path, task: str) -> None:
    """onnx.checker plus: every dynamic axis must stay symbolic in the declared I/O."""
    import onnx

    graph = onnx.load(str(path))
    onnx.checker.check_model(graph, full_check=True)
    for value in list(graph.graph.input) + list(graph.graph.output):
        dims = value.type.tensor_type.shape.dim
        fixed = [
            i
            for i, d in enumerate(dims)
            if d.HasField("dim_value") and not _is_model_axis(task, value.name, i)
        ]
        if fixed:
            raise ExportError(
                f"{path.name}: {value.name} has fixed size on axes {fixed} "
                f"({[d.dim_value for d in dims]}); the traced shape was baked into the graph"
            )


def _is_model_axis(task: str, name: str, axis: int) -> bool:
    # The only static axes are those the model sizes: classify / ner labels, the embedding width.
    declared = dict(TASK_SPECS[task].outputs).get(name, ())
    return axis < len(declared) and declared[axis] in MODEL_AXES
