"""The encoder architectures we load, one row per config.json `model_type`: how each differs from BERT.

Torch-free, so export and the service can accept or refuse a checkpoint without loading it. Every
consumer goes through `architecture()`: checkpoint loading (model/checkpoint.py) renames weights
and config keys with a row, export picks the head class from it (`head_class`), and the task of a
`transformers` checkpoint is read off its `architectures` names (`hf_head_names`).

Adding an architecture: a row here, its differing modules in model/<name>.py (or a commented switch
in model/bert.py), a parity test against `transformers` (tests/model/test_architectures.py) and a
line in docs/models.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from processing.tasks import TASKS

# Not a served task: the masked-LM head, for sparse (SPLADE) vectors; architectures without one here
# (ELECTRA's generator is another model) name none.
MASKED_LM = "masked-lm"


@dataclass(frozen=True)
class Architecture:
    model_type: str  # config.json `model_type`
    hf_name: str  # transformers' class-name stem: {hf_name}Model, {hf_name}ForTokenClassification ...
    # The encoder's attribute inside transformers' heads ("roberta" -> roberta.encoder.layer.0...);
    # ours is always `bert`, and weights are renamed on load and save.
    prefix: str
    # Our head class per task, where it is not BERT's (model.bert.TASK_HEADS): "module.Class" in model/.
    heads: dict[str, str] = field(default_factory=dict)
    # Their config.json key -> our BertConfig field, where the names differ (DistilBERT).
    config_names: dict[str, str] = field(default_factory=dict)
    # BertConfig fields the architecture fixes rather than its config.json (written back never).
    fixed: dict[str, object] = field(default_factory=dict)
    # (their name part, ours) for encoder weights named otherwise than BERT's, applied in order.
    weight_names: tuple[tuple[str, str], ...] = ()
    # The switches model/bert.py reads:
    pooler: bool = True  # the base model has BERT's tanh pooler
    positions_skip_padding: bool = False  # RoBERTa: positions count real tokens from pad_token_id + 1
    tokenizer: str = "WordPiece"  # what its tokenizer.json usually holds (docs only)
    # An architecture of its own in model/<module>.py (config class, encoder, TASK_HEADS), its weights
    # under their own names; None: BERT's modules with the switches above.
    module: str | None = None


# RoBERTa, XLM-R and CamemBERT: their own classification and masked-LM heads, BERT's others.
ROBERTA_HEADS = {
    "classify": "roberta.RobertaForSequenceClassification",
    MASKED_LM: "roberta.RobertaForMaskedLM",
    "sparse": "roberta.RobertaForSparseEmbedding",
}
ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a
    for a in (
        Architecture("bert", "Bert", "bert", heads={MASKED_LM: "bert.BertForMaskedLM"}),
        Architecture(
            "roberta",
            "Roberta",
            "roberta",
            heads=ROBERTA_HEADS,
            positions_skip_padding=True,
            tokenizer="byte-level BPE",
        ),
        Architecture(
            "xlm-roberta",
            "XLMRoberta",
            "roberta",
            heads=ROBERTA_HEADS,
            positions_skip_padding=True,
            tokenizer="Unigram (SentencePiece)",
        ),
        Architecture(
            "camembert",
            "Camembert",
            "roberta",
            heads=ROBERTA_HEADS,
            positions_skip_padding=True,
            tokenizer="Unigram (SentencePiece)",
        ),
        Architecture(
            "electra",
            "Electra",
            "electra",
            heads={
                "classify": "electra.ElectraForSequenceClassification",
                "multiple-choice": "electra.ElectraForMultipleChoice",
            },
            pooler=False,
        ),
        Architecture(
            "distilbert",
            "DistilBert",
            "distilbert",
            heads={
                "classify": "distilbert.DistilBertForSequenceClassification",
                "multiple-choice": "distilbert.DistilBertForMultipleChoice",
                MASKED_LM: "distilbert.DistilBertForMaskedLM",
                "sparse": "distilbert.DistilBertForSparseEmbedding",
            },
            config_names={
                "dim": "hidden_size",
                "n_layers": "num_hidden_layers",
                "n_heads": "num_attention_heads",
                "hidden_dim": "intermediate_size",
                "activation": "hidden_act",
                "dropout": "hidden_dropout_prob",
                "attention_dropout": "attention_probs_dropout_prob",
            },
            fixed={"type_vocab_size": 0, "layer_norm_eps": 1e-12},
            weight_names=(
                ("transformer.layer.", "encoder.layer."),
                (".attention.q_lin.", ".attention.self.query."),
                (".attention.k_lin.", ".attention.self.key."),
                (".attention.v_lin.", ".attention.self.value."),
                (".attention.out_lin.", ".attention.output.dense."),
                (".sa_layer_norm.", ".attention.output.LayerNorm."),
                (".ffn.lin1.", ".intermediate.dense."),
                (".ffn.lin2.", ".output.dense."),
                (".output_layer_norm.", ".output.LayerNorm."),
            ),
            pooler=False,
        ),
        # Their own modules: MPNet's relative-position bias, ModernBERT's rotary/local-global layers.
        Architecture("mpnet", "MPNet", "mpnet", positions_skip_padding=True, module="mpnet"),
        Architecture(
            "modernbert", "ModernBert", "model", pooler=False, tokenizer="byte-level BPE", module="modernbert"
        ),
    )
}

# Architectures people ask for that we refuse, and why (docs/models.md).
REFUSED: dict[str, str] = {
    "deberta": "DeBERTa's disentangled relative-position attention is not implemented",
    "deberta-v2": "DeBERTa-v2's disentangled relative-position attention is not implemented",
    "nomic_bert": "NomicBERT (rotary positions, SwiGLU; trust_remote_code) is not implemented",
    "new": "GTE's 'NewModel' (rotary positions; trust_remote_code) is not implemented",
    "jina_bert": "JinaBERT (ALiBi attention, custom code) is not implemented",
}
# Decoder language models used as embedders (last-token pooling over causal attention).
DECODERS = ("qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3", "phi3", "gpt2", "gpt_neox")


class UnsupportedArchitecture(ValueError):
    """A checkpoint whose model_type we do not implement."""


def refusal(model_type: str, where: str) -> str:
    served = ", ".join(ARCHITECTURES)
    if model_type in REFUSED:
        reason = REFUSED[model_type]
    elif model_type in DECODERS:
        reason = "decoder language models (LLM embedders) are not served: this service runs encoders"
    else:
        reason = "this architecture is not implemented"
    return (
        f"{where}/config.json has model_type {model_type!r}: {reason}. Served model types: {served} "
        "(docs/models.md)"
    )


def architecture(model_type: str | None, where: str = "checkpoint") -> Architecture:
    """The row for `model_type` (absent: BERT, as old checkpoints omit it); refuses what we lack."""
    model_type = model_type or "bert"
    if model_type not in ARCHITECTURES:
        raise UnsupportedArchitecture(refusal(model_type, where))
    return ARCHITECTURES[model_type]


def head_class(model_type: str | None, task: str) -> str:
    """Our head for `task` (or MASKED_LM) on this architecture, as "module.Class" inside model/."""
    arch = architecture(model_type)
    if arch.module is not None:  # its TASK_HEADS, named as BERT's with its own stem
        head = TASKS[task].head if task in TASKS else "BertForMaskedLM"
        return f"{arch.module}.{head.replace('Bert', arch.hf_name, 1)}"
    if task in arch.heads:
        return arch.heads[task]
    if task == "sparse" and MASKED_LM not in arch.heads:
        raise UnsupportedArchitecture(
            f"model_type {arch.model_type!r} has no masked-LM head, so no sparse vectors"
        )
    if task not in TASKS:
        raise UnsupportedArchitecture(f"model_type {arch.model_type!r} has no {task} head here")
    return f"bert.{TASKS[task].head}"


def hf_head_names(arch: Architecture) -> dict[str, str]:
    """transformers' class name -> task, for a checkpoint's config.json `architectures`."""
    names = {}
    for task, spec in TASKS.items():
        for name in (spec.head, *spec.architectures):
            names[arch.hf_name + name.removeprefix("Bert")] = task
    return names


def head_type(model_type: str | None, task: str):
    """The head class itself (imports torch)."""
    import importlib

    module, name = head_class(model_type, task).split(".")
    return getattr(importlib.import_module(f"model.{module}"), name)


def ours_from_theirs(key: str, arch: Architecture) -> str:
    """A transformers weight name -> ours: the encoder under `bert.`, BERT's module names."""
    if arch.module is not None:
        return key
    if key.startswith(arch.prefix + "."):
        key = "bert." + key[len(arch.prefix) + 1 :]
    for theirs, ours in arch.weight_names:
        key = key.replace(theirs, ours)
    return key


def theirs_from_ours(key: str, arch: Architecture) -> str:
    """Our weight name -> the one transformers' class for `arch` expects."""
    if arch.module is not None:
        return key
    for theirs, ours in arch.weight_names:
        key = key.replace(ours, theirs)
    if key.startswith("bert."):
        key = arch.prefix + "." + key[len("bert.") :]
    return key
