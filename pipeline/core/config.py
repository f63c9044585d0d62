"""Typed, strict view of ``params.yaml``.

``params.yaml`` is the single source of configuration: every stage key lives there with its
unit and intent in a comment, and this module only declares types and ranges. Parsing is
strict (like nanoGPT's configurator, but typed and without ``exec``): an unknown key, a wrong
type or an out-of-range value raises :class:`ConfigError` naming the key path, the value and
what was expected; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import re
import reprlib
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from pipeline.core.errors import ConfigError, closest
from pipeline.core.sections.adapt import AdaptConfig
from pipeline.core.sections.base import Seed, Strict
from pipeline.core.sections.compress import CompressConfig
from pipeline.core.sections.demo import DemoConfig
from pipeline.core.sections.evaluate import EvaluateConfig
from pipeline.core.sections.finetune import FinetuneConfig
from pipeline.core.sections.ingest import IngestConfig, task_kind
from pipeline.core.sections.pretrain import PretrainConfig
from pipeline.core.sections.ray import RayConfig
from pipeline.core.sections.register import RegisterConfig
from pipeline.core.sections.schedule import ScheduleConfig
from pipeline.core.sections.search import SearchConfig
from pipeline.core.sections.tokenize import TokenizeConfig
from pipeline.core.sections.tracking import TrackingConfig
from pipeline.core.sections.validate import ValidateConfig

__all__ = [
    "Config",
    "ConfigError",
    "dump_config",
    "load_config",
    "load_params",
    "parse_config",
    "set_dotted",
    "yaml_load",
]


class Config(Strict):
    """The whole of ``params.yaml``."""

    seed: Seed
    precision: Literal["auto", "fp32", "bf16"]
    demo: DemoConfig
    ingest: IngestConfig
    ray: RayConfig
    validation: ValidateConfig = Field(alias="validate")
    tokenize: TokenizeConfig
    adapt: AdaptConfig
    pretrain: PretrainConfig
    finetune: FinetuneConfig
    search: SearchConfig
    evaluate: EvaluateConfig
    compress: CompressConfig
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
            if settings.long_text == "windows" and not task_kind(types[name]).long_text_windows:
                native = (
                    " (it always windows its contexts, by tokenize.doc_stride)"
                    if task_kind(types[name]).windowed
                    else ""
                )
                raise ValueError(
                    f"finetune.tasks.{name}.long_text: windows applies to sequence_classification and "
                    f"pair_classification; task '{name}' is {types[name]}, which has no such windows{native}"
                )
            allowed = task_kind(types[name]).metrics
            if settings.metric is not None and settings.metric not in allowed:
                raise ValueError(
                    f"finetune.tasks.{name}.metric: '{settings.metric}' is not a metric of {types[name]}; expected one of {list(allowed)}"
                )
        self.finetune.task_epochs(list(types))  # an epochs budget names every task's epochs, or none
        return self

    @model_validator(mode="after")
    def _pretrain_reads_what_tokenize_writes(self) -> Config:
        pc, tc = self.pretrain, self.tokenize
        if pc.sentence_objective != "none" and not tc.sentence_pairs:
            raise ValueError(
                f"pretrain.sentence_objective: {pc.sentence_objective} needs sentence pairs: set tokenize.sentence_pairs: true"
            )
        if pc.masking != "token" and not tc.whole_word:
            raise ValueError(f"pretrain.masking: {pc.masking} needs word ids: set tokenize.whole_word: true")
        if self.adapt.needs_selection() and pc.sentence_objective != "none":
            raise ValueError(
                f"adapt.arms: nearest+tapt trains on selected masked-LM blocks, which pretrain.sentence_objective: "
                f"{pc.sentence_objective} cannot pair: drop the arm or set the objective to none"
            )
        return self

    @model_validator(mode="after")
    def _search_has_a_model(self) -> Config:
        trained = ["adapted"] + (["baseline"] if self.finetune.baseline else [])
        if self.search.enabled and not set(self.search.models) & set(trained):
            raise ValueError(
                f"search.models: {self.search.models} names no model finetune trains (finetune.baseline is false): "
                "the search would choose nothing; add adapted, or set finetune.baseline: true"
            )
        return self

    @model_validator(mode="after")
    def _search_tasks_declared(self) -> Config:
        declared = sorted(t.name for t in self.ingest.tasks)
        for name in self.search.task_space:
            if name not in declared:
                raise ValueError(
                    f"search.task_space.{name}: no task '{name}' is declared in ingest.tasks (declared: {declared})"
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


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()  # Python 3.11 takes no limits as arguments
    short.maxlevel, short.maxlist, short.maxtuple, short.maxdict, short.maxstring, short.maxother = 2, 6, 6, 6, 80, 80
    return short


_SHORT_REPR = _short_repr()


def allowed_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the section at ``loc[:-1]`` (a path into :class:`Config`) accepts; [] where it takes any key."""
    model: Any = Config
    parts = list(loc[:-1])
    while parts:
        field = _fields_by_key(model).get(str(parts.pop(0)))
        if field is None:
            return []
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        if typing.get_origin(field.annotation) is dict and parts:  # a mapping of named entries: skip the name
            kinds, parts = [typing.get_args(field.annotation)[1]], parts[1:]
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
        if model is None:
            return []
    return list(_fields_by_key(model))


def _fields_by_key(model: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by the key params.yaml writes (its alias where it has one: ``register``)."""
    return {(f.alias or name): f for name, f in model.model_fields.items()}


def unknown_key_message(loc: tuple[int | str, ...]) -> str:
    """What to say of a key ``loc`` the config does not have: the closest allowed key, when one is close."""
    close = closest(str(loc[-1]), allowed_keys(loc))
    return f"unknown key; did you mean '{close}'?" if close else "unknown key (see params.yaml for the allowed keys)"


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem: ``source: key.path: got <value>; expected <what>``."""
    lines = [f"{source}: invalid configuration ({err.error_count()} problem(s))"]
    for e in err.errors():
        value = e.get("input")
        shown = _SHORT_REPR.repr(value) if not isinstance(value, dict) else "{...}"  # bounded work, any value
        if len(shown) > 80:
            shown = shown[:77] + "..."
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = unknown_key_message(e["loc"])
        elif e["type"] == "missing":
            msg = "required key is missing"
            shown = "nothing"
        if not e["loc"]:  # a rule across sections (Config's own validators): its message names the keys
            lines.append(f"  {msg}")
            continue
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


# libyaml's parser where PyYAML was built with it: ~10x faster than the pure-Python one (dvc.lock, read by every
# stage's lineage tags, is ~70 kB: 0.2 s -> 0.02 s per read); the constructor (safe) and resolver stay Python's.
_SafeLoaderBase: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Yaml12Loader(_SafeLoaderBase):  # type: ignore[valid-type,misc]
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


MAX_YAML_VALUES = 100_000  # values a params file may expand to (params.yaml: ~500); aliases count each time used


def yaml_load(text: str) -> Any:
    """Parse YAML text as params files are parsed (safe, with YAML 1.2 exponent floats).

    A document whose aliases expand to more than :data:`MAX_YAML_VALUES` values (anchors nested in each other:
    a "billion laughs") is refused before it is built: validating or printing it would take minutes and gigabytes.
    """
    loader = _Yaml12Loader(text)  # a SafeLoader subclass: safe
    try:
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, {}) > MAX_YAML_VALUES:
            raise yaml.YAMLError(
                f"it expands to more than {MAX_YAML_VALUES:,} values through aliases (anchors used inside each "
                "other); write the values out"
            )
        return loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Scalars in ``node`` with every alias expanded, counted in linear time (an aliased node is counted once)."""
    if id(node) not in sizes:
        if isinstance(node, yaml.SequenceNode):
            sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            sizes[id(node)] = 1 + sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
        else:
            sizes[id(node)] = 1
    return sizes[id(node)]


def load_params(path: str | Path = "params.yaml") -> dict[str, Any]:
    """Read the raw params mapping (no validation)."""
    return read_yaml_file(Path(path)) or {}


def read_yaml_file(path: Path) -> Any:
    """A params or profile file's YAML document; a missing, unreadable or invalid file is a :class:`ConfigError`
    naming it (a ``!!python/object`` tag too: the loader is safe and refuses it)."""
    if not path.exists():
        raise ConfigError(f"{path}: file not found (run from the project root or pass --params)")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a params file (pass --params path/to/params.yaml)")
    if not path.is_file():  # a FIFO, socket or device: reading it could wait forever
        raise ConfigError(f"{path}: is not a regular file (a pipe or device?); pass --params path/to/params.yaml")
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
    return data


def load_config(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Config:
    """Load ``params.yaml``, apply ``{"section.key": value}`` overrides, and validate."""
    data = load_params(path)
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return parse_config(data, str(path))


def dump_config(cfg: Config, section: str | None = None) -> str:
    """The resolved config as YAML, with the keys as they are spelled in params.yaml (``section``: that one only)."""
    data = cfg.model_dump(mode="json", by_alias=True)
    if section is not None:
        if section not in data:
            close = closest(section, data)
            hint = f"did you mean '{close}'? " if close else ""
            raise ConfigError(f"config show {section}: no such section; {hint}the sections are {', '.join(data)}")
        data = {section: data[section]}
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
