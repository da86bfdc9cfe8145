"""Masked-LM + next-sentence-prediction data for pretraining BERT from scratch.

Input is plain UTF-8 text, one sentence per line, a blank line between documents (the
format of the original BERT `create_pretraining_data.py`).

Sentence pairs are built once, from `seed`: consecutive sentences of a document are packed
into chunks of about `max_seq_len` tokens (shorter with probability `short_seq_prob`, so the
model also sees short inputs), each chunk is split into segment A and segment B, and with
probability 1/2 B is replaced by text from a random other document (NotNext). Masks are drawn
when an item is read, from (seed, epoch, index), so every epoch masks differently while any
run is reproducible; call `set_epoch(epoch)` before iterating an epoch.

Labels follow Hugging Face: `labels` holds the original id at masked positions and -100
elsewhere; `next_sentence_label` is 0 when B continues A and 1 when B is random.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from processing.tokenizer import TextTokenizer

IS_NEXT, NOT_NEXT = 0, 1
IGNORE_INDEX = -100
_TOKENIZE_BATCH = 4096  # lines per tokenizer call: fast, bounded memory


@dataclass
class SentencePair:
    """One NSP example: sentence ranges [start, end) of documents, and the truncated token ids."""

    a_doc: int
    a_sentences: tuple[int, int]
    b_doc: int
    b_sentences: tuple[int, int]
    is_next: bool
    a_ids: np.ndarray
    b_ids: np.ndarray


def read_documents(path: str | Path) -> list[list[str]]:
    """Documents as lists of sentences; raises ValueError naming the file and line on bad input."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pretraining corpus {path} does not exist or is not a file")
    data = path.read_bytes()
    if data.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
        data = data[3:]
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data[:nul].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: contains a NUL byte; expected plain text, is this a binary file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(
            f"{path}:{line}: not valid UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "expected plain text, one sentence per line"
        ) from None

    documents: list[list[str]] = [[]]
    for line in text.splitlines():
        sentence = line.strip()
        if sentence:
            documents[-1].append(sentence)
        elif documents[-1]:
            documents.append([])  # several blank lines in a row still make one boundary
    documents = [d for d in documents if d]
    if not documents:
        raise ValueError(
            f"{path}: no sentences found (expected one sentence per line, a blank line between documents)"
        )
    return documents


class PretrainDataset(torch.utils.data.Dataset):
    def __init__(
        self,
        tokenizer: TextTokenizer,
        path: str | Path,
        max_seq_len: int = 128,
        seed: int = 0,
        mlm_probability: float = 0.15,
        short_seq_prob: float = 0.1,
    ):
        if max_seq_len < 5:
            raise ValueError(f"max_seq_len must be at least 5 ([CLS] A [SEP] B [SEP]), got {max_seq_len}")
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability must be in (0, 1), got {mlm_probability}")
        if not 0.0 <= short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
        self.tokenizer = tokenizer
        self.path = Path(path)
        self.max_seq_len = max_seq_len
        self.seed = seed
        self.mlm_probability = mlm_probability
        self.short_seq_prob = short_seq_prob
        self.epoch = 0

        self.documents = self._tokenize(read_documents(self.path))
        special = {tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id, tokenizer.unk_id}
        self.special_ids = np.array(sorted(special), dtype=np.int64)
        self.is_special = np.zeros(max(tokenizer.vocab_size, int(self.special_ids.max()) + 1), dtype=bool)
        self.is_special[self.special_ids] = True  # a lookup: np.isin sorts on every call
        # Random replacements are drawn from ordinary tokens only.
        self.replacement_ids = np.setdiff1d(np.arange(tokenizer.vocab_size, dtype=np.int64), self.special_ids)
        self.pairs = self._build_pairs(random.Random(seed))
        if not self.pairs:
            raise ValueError(
                f"{self.path}: cannot build sentence pairs; the corpus needs at least two sentences"
            )

    # ------------------------------------------------------------------ corpus

    def _tokenize(self, documents: list[list[str]]) -> list[list[np.ndarray]]:
        flat = [s for doc in documents for s in doc]
        ids: list[np.ndarray] = []
        for start in range(0, len(flat), _TOKENIZE_BATCH):
            ids += [t.ids for t in self.tokenizer.tokenize_batch(flat[start : start + _TOKENIZE_BATCH])]
        tokenized, position = [], 0
        for doc in documents:
            # A line the normalizer reduces to nothing (control characters only) carries no tokens.
            sentences = [s for s in ids[position : position + len(doc)] if len(s)]
            position += len(doc)
            if sentences:
                tokenized.append(sentences)
        return tokenized

    def _build_pairs(self, rng: random.Random) -> list[SentencePair]:
        if len(self.documents) == 1:
            warnings.warn(
                f"{self.path} holds a single document (no blank lines); NotNext segments are taken "
                "from a distant part of the same document",
                stacklevel=3,
            )
        # A lone sentence at a document's end can only be NotNext; such forced pairs would tilt the
        # labels towards NotNext (~60/40 on short documents), so while NotNext leads, pick IsNext.
        self._not_next_lead = 0
        pairs: list[SentencePair] = []
        for doc_index in range(len(self.documents)):
            pairs += self._pairs_from_document(doc_index, rng)
        return pairs

    def _pairs_from_document(self, doc_index: int, rng: random.Random) -> list[SentencePair]:
        """Greedy packing of consecutive sentences into chunks, each split into an A/B pair."""
        doc = self.documents[doc_index]
        max_tokens = self.max_seq_len - 3  # [CLS] A [SEP] B [SEP]
        pairs: list[SentencePair] = []
        start = 0
        while start < len(doc):
            target = max_tokens
            if rng.random() < self.short_seq_prob:
                target = rng.randint(2, max_tokens)
            end, length = start, 0
            while end < len(doc) and length < target:
                length += len(doc[end])
                end += 1
            want_next = rng.random() < 0.5 or self._not_next_lead > 0
            if end - start == 1 and want_next and end < len(doc):
                end += 1  # one long sentence: take the next one as B rather than forcing NotNext
            a_end = start + 1 if end - start == 1 else rng.randint(start + 1, end - 1)
            a_length = sum(len(s) for s in doc[start:a_end])

            random_b = None
            if not want_next or end - start == 1:
                random_b = self._random_segment(doc_index, start, a_end, max(1, target - a_length), rng)
            if random_b is not None:
                b_doc, b_start, b_end = random_b
                next_start = a_end  # the unused rest of the chunk is packed again
            elif end - start > 1:
                b_doc, b_start, b_end = doc_index, a_end, end
                next_start = end
            else:
                start = end  # a lone sentence with nothing to pair it with
                continue
            a_ids = np.concatenate(doc[start:a_end])
            b_ids = np.concatenate(self.documents[b_doc][b_start:b_end])
            a_ids, b_ids = _truncate_pair(a_ids, b_ids, max_tokens)
            pairs.append(
                SentencePair(
                    doc_index, (start, a_end), b_doc, (b_start, b_end), random_b is None, a_ids, b_ids
                )
            )
            self._not_next_lead += -1 if random_b is None else 1
            start = next_start
        return pairs

    def _random_segment(
        self, doc_index: int, a_start: int, a_end: int, target: int, rng: random.Random
    ) -> tuple[int, int, int] | None:
        """(doc, start, end) of about `target` tokens that is not A's continuation, or None."""
        if len(self.documents) > 1:
            other = rng.randrange(len(self.documents) - 1)
            b_doc = other + (other >= doc_index)  # uniform over the other documents
            b_start = rng.randrange(len(self.documents[b_doc]))
            stop = len(self.documents[b_doc])
        else:
            # One document: start anywhere except inside A or at A's true continuation, and don't
            # run into A.
            doc_len = len(self.documents[doc_index])
            outside = a_start + (doc_len - a_end - 1)  # sentences before A, and after A's successor
            if outside <= 0:
                return None
            b_start = rng.randrange(outside)
            b_start += 0 if b_start < a_start else a_end - a_start + 1
            b_doc = doc_index
            stop = a_start if b_start < a_start else doc_len
        sentences = self.documents[b_doc]
        b_end, length = b_start, 0
        while b_end < stop and length < target:
            length += len(sentences[b_end])
            b_end += 1
        return b_doc, b_start, b_end

    # ------------------------------------------------------------------ items

    def set_epoch(self, epoch: int) -> None:
        """Masks of epoch e are drawn from (seed, e, index): new each epoch, the same on every rerun.

        DataLoader workers get a copy of the dataset when an iterator starts, so call this before
        iterating (and don't combine it with persistent_workers=True).
        """
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        pair = self.pairs[index]
        tok = self.tokenizer
        input_ids = np.concatenate([[tok.cls_id], pair.a_ids, [tok.sep_id], pair.b_ids, [tok.sep_id]])
        input_ids = input_ids.astype(np.int64)
        n_first = len(pair.a_ids) + 2
        token_type_ids = np.zeros(len(input_ids), dtype=np.int64)
        token_type_ids[n_first:] = 1
        rng = np.random.default_rng([self.seed, self.epoch, index])
        masked, labels = self.mask_tokens(input_ids, rng)
        return {
            "input_ids": masked,
            "token_type_ids": token_type_ids,
            "attention_mask": np.ones(len(input_ids), dtype=np.int64),
            "labels": labels,
            "next_sentence_label": np.array(IS_NEXT if pair.is_next else NOT_NEXT, dtype=np.int64),
        }

    def mask_tokens(self, input_ids: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """BERT masking: pick mlm_probability of the ordinary tokens; of those 80% become [MASK],
        10% a random token and 10% stay, and all of them are predicted."""
        candidates = np.flatnonzero(~self.is_special[input_ids])
        # Stochastic rounding keeps the expected fraction exact even for short inputs; at least
        # one prediction per example so the MLM loss is never empty.
        expected = self.mlm_probability * len(candidates)
        count = min(len(candidates), max(1, int(expected + rng.random())))
        chosen = rng.choice(candidates, size=count, replace=False) if len(candidates) else candidates
        labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
        labels[chosen] = input_ids[chosen]
        masked = input_ids.copy()
        action = rng.random(len(chosen))
        to_mask = chosen[action < 0.8]
        to_random = chosen[(action >= 0.8) & (action < 0.9)]
        masked[to_mask] = self.tokenizer.mask_id
        masked[to_random] = rng.choice(self.replacement_ids, size=len(to_random))
        return masked, labels


def _truncate_pair(a_ids: np.ndarray, b_ids: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Longest-first truncation that keeps the A|B seam intact: A loses its start, B its end."""
    n_a, n_b = len(a_ids), len(b_ids)
    while n_a + n_b > max_tokens:
        if n_a > n_b:
            n_a -= 1
        else:
            n_b -= 1
    return a_ids[len(a_ids) - n_a :], b_ids[:n_b]


def collate_pretrain(items: list[dict[str, np.ndarray]], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad a list of PretrainDataset items into [batch, seq] int64 tensors."""
    if not items:
        raise ValueError("cannot collate an empty batch")
    length = max(len(item["input_ids"]) for item in items)
    fill = {"input_ids": pad_id, "token_type_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX}
    batch = {key: np.full((len(items), length), value, dtype=np.int64) for key, value in fill.items()}
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        for key in fill:
            batch[key][row, :n] = item[key]
    out = {key: torch.from_numpy(value) for key, value in batch.items()}
    out["next_sentence_label"] = torch.as_tensor(
        np.array([item["next_sentence_label"] for item in items], dtype=np.int64)
    )
    return out


@torch.no_grad()
def masked_hits(prediction_logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `labels` (B, T): MLM predictions right, and positions masked. The logits are
    (B, T, vocab), or (masked, vocab) from a model that scores the masked positions only."""
    selected = labels != IGNORE_INDEX
    logits = prediction_logits[selected] if prediction_logits.dim() == 3 else prediction_logits
    right = (logits.argmax(-1) == labels[selected]).long()
    rows = selected.nonzero()[:, 0]  # the row of each masked position, row-major as the logits
    size = labels.shape[0]
    return torch.bincount(rows, weights=right, minlength=size).long(), selected.sum(dim=1)


@torch.no_grad()
def mlm_nsp_accuracy(
    prediction_logits: torch.Tensor,
    labels: torch.Tensor,
    nsp_logits: torch.Tensor | None = None,
    nsp_labels: torch.Tensor | None = None,
) -> dict[str, float]:
    """MLM accuracy over masked positions only (labels != -100), and NSP accuracy.

    Also returns the counts behind each accuracy so callers can average over batches
    correctly (sum correct / sum total rather than the mean of per-batch ratios).
    """
    mlm_correct, mlm_total = (int(n.sum()) for n in masked_hits(prediction_logits, labels))
    result = {
        "mlm_accuracy": mlm_correct / mlm_total if mlm_total else 0.0,
        "mlm_correct": float(mlm_correct),
        "mlm_total": float(mlm_total),
    }
    if nsp_logits is not None and nsp_labels is not None:
        nsp_labels = nsp_labels.view(-1)
        nsp_correct = int((nsp_logits.argmax(-1) == nsp_labels).sum())
        result.update(
            nsp_accuracy=nsp_correct / len(nsp_labels) if len(nsp_labels) else 0.0,
            nsp_correct=float(nsp_correct),
            nsp_total=float(len(nsp_labels)),
        )
    return result
