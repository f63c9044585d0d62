"""Typed, strict view of ``params.yaml``.

``params.yaml`` is the single source of configuration: every stage key lives there with its
unit and intent in a comment, and this module only declares types and ranges. Parsing is
strict (like nanoGPT's configurator, but typed and without ``exec``): an unknown key, a wrong
type or an out-of-range value raises :class:`ConfigError` naming the key path, the value and
what was expected; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

TaskType = Literal["sequence_classification", "pair_classification", "token_classification", "extractive_qa"]
SPLITS = ("train", "validation", "test")

# Field names each task type reads from its files, with their defaults. A user maps them to
# the column/key names of their own files with ``fields:``.
TASK_FIELDS: dict[str, dict[str, str]] = {
    "sequence_classification": {"text": "text", "label": "label"},
    "pair_classification": {"text": "text", "text_pair": "text_pair", "label": "label"},
    "token_classification": {"tokens": "tokens", "tags": "tags"},
    "extractive_qa": {"question": "question", "context": "context", "answers": "answers"},
}


def input_texts(task_type: str, row: Mapping[str, Any]) -> list[str]:
    """The model-input texts of one normalised task row (ingest's Parquet columns), without its label."""
    if task_type == "token_classification":
        return [" ".join(row["tokens"])]
    if task_type == "extractive_qa":
        return [row["question"], row["context"]]
    if task_type == "pair_classification":
        return [row["text"], row["text_pair"]]
    return [row["text"]]


class ConfigError(ValueError):
    """A params file that cannot be used; the message names key path, value and expectation."""


class Strict(BaseModel):
    """Base of every config section: frozen, no unknown keys, no silent type coercion."""

    # allow_inf_nan=False: .inf / .nan are never a meaningful rate, size or threshold
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any) -> Any:
        """Integers must fit in 64 bits (PyArrow, NumPy and PyTorch take nothing larger)."""
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise ValueError(f"integer {value} is outside the 64-bit range")
        return value


Seed = Annotated[int, Field(ge=0, lt=2**32)]  # NumPy's and PyTorch's seed range


# ----------------------------------------------------------------------------- demo


class DemoConfig(Strict):
    """Sizes of the seeded synthetic pharmacology domain (``python -m pipeline demo``)."""

    seed: Seed
    corpus_docs: int = Field(ge=1)
    sentences_per_doc: list[int] = Field(min_length=2, max_length=2)
    drugs: int = Field(ge=4)  # a quarter each reserved for validation and test examples
    targets: int = Field(ge=4)  # molecular targets of the drugs, split like them
    diseases: int = Field(ge=4)
    role_examples: int = Field(ge=10)
    pair_examples: int = Field(ge=10)
    ner_examples: int = Field(ge=10)
    qa_examples: int = Field(ge=10)
    eval_fraction: float = Field(gt=0, lt=0.5)

    @model_validator(mode="after")
    def _check_range(self) -> DemoConfig:
        lo, hi = self.sentences_per_doc
        if not 1 <= lo <= hi:
            raise ValueError(f"sentences_per_doc must be [min, max] with 1 <= min <= max, got {self.sentences_per_doc}")
        return self


# ----------------------------------------------------------------------------- ingest

FileFormat = Literal["auto", "txt", "jsonl", "csv", "parquet", "conll"]


class FileSource(Strict):
    """Local files: a path or glob; ``.gz`` is read transparently."""

    type: Literal["files"]
    path: str = Field(min_length=1)
    format: FileFormat = "auto"
    text_field: str = "text"
    txt_mode: Literal["line", "paragraph"] = "line"


class HFSource(Strict):
    """A Hugging Face ``datasets`` id, read in streaming mode; needs network access."""

    type: Literal["hf"]
    name: str = Field(min_length=1)
    config_name: str | None = None
    split: str = "train"
    text_field: str = "text"
    max_docs: int | None = Field(default=None, ge=1)


CorpusSource = Annotated[FileSource | HFSource, Field(discriminator="type")]


class CorpusConfig(Strict):
    sources: list[CorpusSource] = Field(min_length=1)
    min_chars: int = Field(ge=0)
    max_chars: int = Field(ge=1)
    min_words: int = Field(ge=0)
    max_words: int = Field(ge=1)
    validation_fraction: float = Field(ge=0, lt=1)

    @model_validator(mode="after")
    def _check_bounds(self) -> CorpusConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) > max_chars ({self.max_chars})")
        if self.min_words > self.max_words:
            raise ValueError(f"min_words ({self.min_words}) > max_words ({self.max_words})")
        return self


class TaskConfig(Strict):
    """A labelled task declared as data: its type picks the head, fields map file columns."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    type: TaskType
    files: dict[str, str]
    format: FileFormat = "auto"
    fields: dict[str, str] = Field(default_factory=dict)
    labels: list[str] | None = None

    @model_validator(mode="after")
    def _check_files_and_fields(self) -> TaskConfig:
        if self.labels is not None:
            dupes = sorted({x for x in self.labels if self.labels.count(x) > 1})
            if dupes:
                raise ValueError(f"labels: duplicate label(s) {dupes}; each label once")
            if self.type in ("sequence_classification", "pair_classification") and len(self.labels) < 2:
                raise ValueError(f"labels: a classification task needs at least two labels, got {self.labels}")
        unknown = sorted(set(self.files) - set(SPLITS))
        if unknown:
            raise ValueError(f"files: unknown split(s) {unknown}; expected keys among {list(SPLITS)}")
        missing = [s for s in SPLITS if s not in self.files]
        if missing:
            raise ValueError(f"files: missing split(s) {missing}; train, validation and test are required")
        allowed = TASK_FIELDS[self.type]
        bad = sorted(set(self.fields) - set(allowed))
        if bad:
            raise ValueError(
                f"fields: unknown key(s) {bad} for type {self.type}; expected keys among {sorted(allowed)}"
            )
        return self

    def field(self, key: str) -> str:
        """Column/key name in the task's files for the logical field ``key``."""
        return self.fields.get(key, TASK_FIELDS[self.type][key])


class IngestConfig(Strict):
    corpus: CorpusConfig
    tasks: list[TaskConfig]
    unicode_form: Literal["NFC", "NFKC"]
    on_error: Literal["fail", "skip"]
    max_record_bytes: int = Field(ge=1024)
    csv_multiline: bool = False
    chunk_docs: int = Field(ge=1)
    leakage_min_chars: int = Field(ge=1)

    @model_validator(mode="after")
    def _unique_task_names(self) -> IngestConfig:
        names = [t.name for t in self.tasks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"tasks: duplicate task name(s) {dupes}")
        return self


# ----------------------------------------------------------------------------- validate


class CorpusChecks(Strict):
    min_docs: int = Field(ge=0)
    min_chars: int = Field(ge=0)
    max_chars: int = Field(ge=1)
    length_mostly: float = Field(gt=0, le=1)
    median_chars_min: float = Field(ge=0)
    median_chars_max: float = Field(ge=0)
    max_duplicate_ratio: float = Field(ge=0, le=1)
    max_replacement_char_share: float = Field(ge=0, le=1)
    max_nonprintable_share: float = Field(ge=0, le=1)
    max_docs_checked: int = Field(ge=1)


class TaskChecks(Strict):
    min_examples_per_label: int = Field(ge=0)
    max_train_overlap: float = Field(ge=0, le=1)
    min_examples: int = Field(ge=0)


class ValidateConfig(Strict):
    corpus: CorpusChecks
    tasks: TaskChecks
    max_offending_records: int = Field(ge=0, le=100)


# ----------------------------------------------------------------------------- tokenize


class ExtendVocab(Strict):
    """Mine whole domain words the base vocab splits into many pieces and add them as tokens."""

    enabled: bool
    max_new_tokens: int = Field(ge=0)
    min_frequency: int = Field(ge=1)
    min_pieces: int = Field(ge=2)


class ScratchVocab(Strict):
    """A WordPiece vocab trained from the corpus with ``tokenizers``' WordPieceTrainer."""

    vocab_size: int = Field(ge=10)
    min_frequency: int = Field(ge=1)
    lowercase: bool
    special_tokens: list[str] = Field(min_length=5)

    @model_validator(mode="after")
    def _bert_specials(self) -> ScratchVocab:
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in self.special_tokens]
        if missing:
            raise ValueError(f"special_tokens must contain the BERT special tokens, missing {missing}")
        return self


class TokenizeConfig(Strict):
    base_tokenizer: str = Field(min_length=1)
    mode: Literal["wordpiece", "wordpiece_scratch"]
    extend_vocab: ExtendVocab
    scratch: ScratchVocab
    whole_word: bool
    language: Literal["en", "zh"]
    jieba_user_dict: str | None
    max_seq_length: int = Field(ge=8)
    sentence_pairs: bool
    label_all_tokens: bool
    doc_stride: int = Field(ge=0)
    batch_docs: int = Field(ge=1)
    mining_max_docs: int = Field(ge=1)
    domain_terms: str | None

    @model_validator(mode="after")
    def _check(self) -> TokenizeConfig:
        if self.extend_vocab.enabled and self.mode != "wordpiece":
            raise ValueError("extend_vocab.enabled needs mode: wordpiece (a scratch vocab is already the corpus's own)")
        if self.doc_stride >= self.max_seq_length // 2:
            raise ValueError(
                f"doc_stride ({self.doc_stride}) must be below half of max_seq_length ({self.max_seq_length})"
            )
        return self


# ----------------------------------------------------------------------------- pretrain


class ScratchModel(Strict):
    """The BertConfig used when ``pretrain.base_model: scratch``."""

    hidden_size: int = Field(ge=8)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    intermediate_size: int = Field(ge=8)
    max_position_embeddings: int = Field(ge=8)

    @model_validator(mode="after")
    def _heads_divide(self) -> ScratchModel:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads ({self.num_attention_heads})"
            )
        return self


class PretrainConfig(Strict):
    base_model: str = Field(min_length=1)
    scratch: ScratchModel
    masking: Literal["token", "whole_word", "span"]
    mlm_probability: float = Field(gt=0, lt=1)
    mask_replace_prob: float = Field(ge=0, le=1)
    random_replace_prob: float = Field(ge=0, le=1)
    span_geometric_p: float = Field(gt=0, le=1)
    span_max_words: int = Field(ge=1)
    sentence_objective: Literal["none", "sop", "nsp"]
    sentence_loss_weight: float = Field(ge=0)
    max_steps: int = Field(ge=1)
    head_warmup_steps: int = Field(ge=0)
    task_text: bool  # DAPT+TAPT: also train on the labelled tasks' train inputs (no labels)
    micro_batch_size: int = Field(ge=1)
    gradient_accumulation_steps: int = Field(ge=1)
    learning_rate: float = Field(gt=0)
    weight_decay: float = Field(ge=0)
    warmup_steps: int = Field(ge=0)
    lr_schedule: Literal["linear", "cosine"]
    max_grad_norm: float = Field(gt=0)
    logging_steps: int = Field(ge=1)
    eval_steps: int = Field(ge=1)
    eval_max_blocks: int = Field(ge=1)
    eval_seed: Seed
    save_steps: int = Field(ge=1)
    save_total_limit: int = Field(ge=1)
    mlm_head: Literal["masked_only", "dense"]
    attention_dropout: float | None = Field(ge=0, lt=1)
    hidden_dropout: float | None = Field(ge=0, lt=1)
    torch_compile: bool
    nproc: int = Field(ge=1)

    @model_validator(mode="after")
    def _check(self) -> PretrainConfig:
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(
                f"mask_replace_prob + random_replace_prob must not exceed 1, got {self.mask_replace_prob} + {self.random_replace_prob}"
            )
        if self.save_steps % self.logging_steps:
            raise ValueError(
                f"save_steps ({self.save_steps}) must be a multiple of logging_steps ({self.logging_steps}): "
                "the NaN check runs on logged losses and must see every step before a checkpoint is written"
            )
        if self.head_warmup_steps >= self.max_steps:
            raise ValueError(
                f"head_warmup_steps ({self.head_warmup_steps}) must be below max_steps ({self.max_steps}): "
                "the encoder would never train"
            )
        if self.sentence_objective != "none" and self.masking != "token":
            raise ValueError(
                f"sentence_objective: {self.sentence_objective} trains on sentence pairs, which carry no word ids: "
                "use masking: token with it"
            )
        return self


# ----------------------------------------------------------------------------- finetune / evaluate

# Metrics a task of each type can be selected (early stopping) and compared (DAPT vs baseline) on;
# the first one is the default.
PRIMARY_METRICS: dict[str, tuple[str, ...]] = {
    "sequence_classification": ("macro_f1", "micro_f1", "accuracy"),
    "pair_classification": ("macro_f1", "micro_f1", "accuracy"),
    "token_classification": ("f1", "precision", "recall"),
    "extractive_qa": ("f1", "exact_match"),
}


class FinetuneTaskConfig(Strict):
    """Per-task fine-tuning settings; a task not listed under ``finetune.tasks`` gets these defaults."""

    pooling: Literal["cls", "mean"] = "cls"
    loss_weight: float = Field(default=1.0, gt=0)
    class_weights: Literal["none", "balanced"] = "none"
    metric: str | None = None
    sampling_weight: float = Field(default=1.0, gt=0)
    n_best: int = Field(default=20, ge=1)
    max_answer_tokens: int = Field(default=30, ge=1)


class FinetuneConfig(Strict):
    baseline: bool
    single_task: bool
    max_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    eval_batch_size: int = Field(ge=1)
    learning_rate: float = Field(gt=0)
    layer_lr_decay: float = Field(gt=0, le=1)
    weight_decay: float = Field(ge=0)
    warmup_ratio: float = Field(ge=0, lt=1)
    lr_schedule: Literal["linear", "cosine"]
    max_grad_norm: float = Field(gt=0)
    dropout: float = Field(ge=0, lt=1)
    sampling: Literal["proportional", "temperature", "fixed"]
    temperature: float = Field(gt=0)
    bucket_batches: int = Field(ge=1)
    eval_steps: int = Field(ge=1)
    early_stopping_patience: int = Field(ge=1)
    early_stopping_threshold: float = Field(ge=0)
    logging_steps: int = Field(ge=1)
    save_total_limit: int = Field(ge=1)
    tasks: dict[str, FinetuneTaskConfig] = Field(default_factory=dict)

    def task(self, name: str) -> FinetuneTaskConfig:
        """Settings of task ``name`` (the defaults when it is not listed)."""
        return self.tasks.get(name, FinetuneTaskConfig())


class EvaluateConfig(Strict):
    batch_size: int = Field(ge=1)
    bootstrap_resamples: int = Field(ge=0)
    confidence: float = Field(gt=0, lt=1)


# ----------------------------------------------------------------------------- register / tracking


class RegisterConfig(Strict):
    """The registry entry and the promotion gate (``pipeline.tracking.registry.should_promote``)."""

    model_name: str = Field(min_length=1)
    min_delta: float
    max_regression: float = Field(ge=0)
    min_gain_over_trivial: float
    floors: dict[str, float] = Field(default_factory=dict)
    log_fill_mask: bool


class TrackingConfig(Strict):
    """MLflow run logging; where to (``MLFLOW_TRACKING_URI``) is environment, not params."""

    enabled: bool
    experiment: str = Field(min_length=1)
    retries: int = Field(ge=0)
    retry_backoff_s: int = Field(ge=0)  # MLflow takes an integer backoff factor
    request_timeout_s: int = Field(ge=1)


class ScheduleConfig(Strict):
    """The Prefect deployment (``flows/``): when it runs, retries of transient failures, stage timeouts."""

    cron: str = Field(min_length=1)
    timezone: str = Field(min_length=1)
    retries: int = Field(ge=0)
    retry_delay_s: list[float] = Field(min_length=1)
    timeout_s: dict[str, int] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> ScheduleConfig:
        if "default" not in self.timeout_s:
            raise ValueError("timeout_s needs a 'default' entry (seconds) for the stages not listed")
        if any(v <= 0 for v in self.timeout_s.values()):
            raise ValueError(f"timeout_s values must be positive seconds, got {self.timeout_s}")
        return self

    def timeout_for(self, stage: str) -> int:
        """Wall-clock limit of ``stage`` in seconds."""
        return self.timeout_s.get(stage, self.timeout_s["default"])


class Config(Strict):
    """The whole of ``params.yaml``."""

    seed: Seed
    precision: Literal["auto", "fp32", "bf16"]
    demo: DemoConfig
    ingest: IngestConfig
    validation: ValidateConfig = Field(alias="validate")
    tokenize: TokenizeConfig
    pretrain: PretrainConfig
    finetune: FinetuneConfig
    evaluate: EvaluateConfig
    registration: RegisterConfig = Field(alias="register")
    tracking: TrackingConfig
    schedule: ScheduleConfig

    @model_validator(mode="after")
    def _finetune_tasks_declared(self) -> Config:
        types = {t.name: t.type for t in self.ingest.tasks}
        for name, settings in self.finetune.tasks.items():
            if name not in types:
                raise ValueError(
                    f"finetune.tasks.{name}: no task '{name}' is declared in ingest.tasks (declared: {sorted(types)})"
                )
            allowed = PRIMARY_METRICS[types[name]]
            if settings.metric is not None and settings.metric not in allowed:
                raise ValueError(
                    f"finetune.tasks.{name}.metric: '{settings.metric}' is not a metric of {types[name]}; expected one of {list(allowed)}"
                )
        return self


def _key_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
        elif item in ("files", "hf") and parts and parts[-1].endswith("]"):
            continue  # discriminator tag pydantic inserts in union locations
        else:
            parts.append(str(item))
    return ".".join(parts) or "<root>"


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: ``source: key.path: got <value>; expected <what>``."""
    lines = [f"{source}: invalid configuration ({err.error_count()} problem(s))"]
    for e in err.errors():
        value = e.get("input")
        shown = repr(value) if not isinstance(value, dict) else "{...}"
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key (typo? see params.yaml comments for the allowed keys)"
        elif e["type"] == "missing":
            msg = "required key is missing"
            shown = "nothing"
        lines.append(f"  {_key_path(e['loc'])}: got {shown}; expected: {msg}")
    return "\n".join(lines)


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """``data["a"]["b"] = value`` for ``dotted`` ``"a.b"``; a missing section is a :class:`ConfigError`."""
    node = data
    keys = dotted.split(".")
    for k in keys[:-1]:
        if not isinstance(node.get(k), dict):
            raise ConfigError(f"override {dotted}: '{k}' is not a section")
        node = node[k]
    node[keys[-1]] = value


def parse_config(data: Any, source: str = "params.yaml") -> Config:
    """Validate a parsed params mapping into a frozen :class:`Config`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of sections at the top level, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 exponent floats: ``5e-05`` (as DVC's ruamel writes a float that
    ``dvc exp run -S`` set) is a float, where YAML 1.1 (PyYAML) would read the string ``'5e-05'``.
    A key given twice in one mapping is an error (YAML 1.2 forbids it; PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key '{key}' is given twice (first on line {seen[key] + 1}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def yaml_load(text: str) -> Any:
    """Parse YAML text as params files are parsed (safe, with YAML 1.2 exponent floats)."""
    return yaml.load(text, Loader=_Yaml12Loader)  # a SafeLoader subclass: safe


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read the raw params mapping (no validation)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found (run from the project root or pass --params)")
    if not path.is_file():
        raise ConfigError(f"{path}: is a directory, not a params file (pass --params path/to/params.yaml)")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: byte 0x{raw[err.start]:02x} at offset {err.start} is not valid UTF-8; save the file as UTF-8"
        ) from None
    try:
        data = yaml_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return data or {}


def load_config(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Config:
    """Load ``params.yaml``, apply ``{"section.key": value}`` overrides, and validate."""
    data = load_params(path)
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return parse_config(data, str(path))


def dump_config(cfg: Config) -> str:
    """The resolved config as YAML, with the keys as they are spelled in params.yaml."""
    return yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True), sort_keys=False, allow_unicode=True)
