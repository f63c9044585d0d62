"""The embedded default domain: seeded, synthetic pharmacology trial reports.

Everything here is invented (drug, target and disease names, doses, outcomes) but consistent:
each drug has one class, one molecular target, one disease, one dose and one true effect, and
every report, task example and answer agrees with them. ``write_demo`` writes the corpus and four
labelled tasks as ordinary files (gzipped JSONL, CSV, JSONL, CoNLL) that ``ingest`` reads like
any user data.

The demo is built so that domain adaptation *can* show, in either direction:

- Drugs and targets are split three ways. The labelled train split mentions only the ``train``
  drugs and targets; validation and test mention only their own, never seen in labelled
  training. The unlabelled corpus describes all of them (the situation DAPT exists for).
- Drug and target names come from one name generator, so their spelling does not say which is
  which, nor a drug's class: only the corpus, where drugs are dosed and targets are measured,
  and "X is a kinase inhibitor that acts on Y", does.
- ``ner``, ``pair`` and ``qa`` have items that need this knowledge (an unseen name in a context
  that fits a drug and a target alike; a claim about an unseen drug's class; "which of the two
  drugs is a ...?") next to items that the text alone answers. ``role`` is a control: sentence
  roles need no corpus knowledge, and some sentence forms occur in two roles, as in real
  abstracts, so no model reaches 100.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the params sections sit above this floor (docs/architecture.md)
    from pipeline.core.sections.demo import DemoConfig


SPLITS = ("train", "validation", "test")

# ----------------------------------------------------------------------------- the world

_ONSETS = [
    "zor",
    "quel",
    "tef",
    "vix",
    "dral",
    "mop",
    "kest",
    "ulv",
    "pram",
    "brix",
    "sel",
    "nor",
    "fen",
    "oxa",
    "tar",
    "lum",
    "cav",
    "rid",
    "gal",
    "hes",
    "yob",
    "plen",
    "trov",
    "sarn",
]
_MIDDLES = ["va", "pra", "lo", "ti", "xe", "mu", "ra", "do", "ne", "si", "qui", "zo"]
# One word (one WordPiece token) each, all taking "an": a masked class word can only be recovered from the drug's name
# (with "kinase inhibitor", the unmasked "inhibitor" would give "kinase" away).
CLASSES = ["inhibitor", "analogue", "antagonist", "antibody"]
# Naming conventions, as real drug stems are (-mab, -tinib, -olol): a drug's name ends in a stem
# of its class, a target's in a target ending, after a hyphen. Each has two forms: one for the drugs and targets
# that labelled training shows, one for those kept for validation and test, so that only the
# corpus (which uses both) teaches what an evaluation name's ending means.
DRUG_STEMS = {
    "inhibitor": ("quorin", "taxone"),
    "analogue": ("deltax", "sulvin"),
    "antagonist": ("mivane", "brelide"),
    "antibody": ("ostrel", "parnic"),
}
TARGET_ENDINGS = (("kase", "dulin"), ("pherin", "grelase"))  # (train forms, evaluation forms)
_DISEASE_ADJ = [
    "cryptal",
    "dorsolytic",
    "pelvoid",
    "vasculent",
    "myxoid",
    "thalamic",
    "renoform",
    "glandrous",
    "ostemic",
    "lymphoblastoid",
    "cortivalent",
    "spinotic",
]
_DISEASE_NOUN = [
    "myelitis",
    "fasciitis",
    "anaemia",
    "neuropathy",
    "dermatosis",
    "arteritis",
    "nephrosis",
    "carditis",
    "sclerosis",
    "hepatopathy",
]
_EPONYMS = ["Harlow", "Venner", "Tarsik", "Okonkwo", "Brandvold", "Quist", "Maelor", "Ilves", "Dumitrescu", "Feyling"]
_ORGANS = ["renal", "hepatic", "neuromuscular", "cutaneous", "cardiac", "haematological", "pulmonary"]
_OUTCOMES = [
    "complete remission",
    "symptom resolution",
    "a 50% reduction in flare frequency",
    "normalisation of serum markers",
    "sustained clinical response",
    "freedom from relapse",
]
_ADVERSE = [
    "nausea",
    "headache",
    "transient neutropenia",
    "elevated transaminases",
    "rash",
    "fatigue",
    "peripheral oedema",
    "insomnia",
]
_FREQ = ["once daily", "twice daily", "every two weeks", "weekly", "three times daily"]
_UNITS = ["mg", "mg/kg", "µg", "mL"]
_DESIGNS = ["double-blind", "open-label", "placebo-controlled", "multicentre", "single-centre"]


@dataclass(frozen=True)
class Drug:
    name: str
    klass: str
    target: str
    disease: str
    dose: str
    benefit: bool
    adverse: str
    split: str  # the labelled split whose examples may mention it


@dataclass(frozen=True)
class World:
    drugs: list[Drug]
    targets: dict[str, str]  # target name -> split
    diseases: list[str]

    def drugs_in(self, split: str) -> list[Drug]:
        return [d for d in self.drugs if d.split == split]

    def targets_in(self, split: str) -> list[str]:
        return [t for t, s in self.targets.items() if s == split]


def _invent_names(count: int, make: Callable[[], str], taken: set[str]) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = make()
        if name not in taken:
            taken.add(name)
            names.append(name)
    return names


def _assign_splits(count: int) -> list[str]:
    """Half for train, a quarter each for validation and test (at least one each)."""
    n_eval = max(1, count // 4)
    return ["validation"] * n_eval + ["test"] * n_eval + ["train"] * (count - 2 * n_eval)


def build_world(cfg: DemoConfig) -> World:
    """The fixed facts of the fictional domain, a pure function of ``cfg.seed``."""
    rng = random.Random(cfg.seed)

    def disease() -> str:
        if rng.random() < 0.3:
            return f"{rng.choice(_EPONYMS)}-{rng.choice(_EPONYMS)} {rng.choice(['syndrome', 'disease'])}"
        return f"{rng.choice(_DISEASE_ADJ)} {rng.choice(_DISEASE_NOUN)}"

    def name(endings: tuple[str, ...]) -> Callable[[], str]:
        # the hyphen keeps the stem a word of its own (as in "adalimumab-atto"), so every
        # tokenizer splits it the same way whatever precedes it
        return lambda: rng.choice(_ONSETS) + rng.choice(_MIDDLES) + "-" + rng.choice(endings)

    def form(split: str) -> int:
        return 0 if split == "train" else 1

    diseases = _invent_names(cfg.diseases, disease, set())
    taken: set[str] = set()
    target_splits = _assign_splits(cfg.targets)
    targets = {_invent_names(1, name(TARGET_ENDINGS[form(split)]), taken)[0]: split for split in target_splits}
    drugs = []
    splits = _assign_splits(cfg.drugs)
    for i, split in enumerate(splits):
        klass = CLASSES[(i - splits.index(split)) % len(CLASSES)]  # classes balanced within every split
        drug_name = _invent_names(1, name((DRUG_STEMS[klass][form(split)],)), taken)[0]
        dose = f"{rng.choice([0.5, 1, 2.5, 5, 10, 20, 40, 80, 150, 300]):g} {rng.choice(_UNITS)} {rng.choice(_FREQ)}"
        same_split_targets = [t for t, s in targets.items() if s == split]
        drugs.append(
            Drug(
                drug_name,
                klass,
                rng.choice(same_split_targets),
                rng.choice(diseases),
                dose,
                rng.random() < 0.6,
                rng.choice(_ADVERSE),
                split,
            )
        )
    return World(drugs, targets, diseases)


# ----------------------------------------------------------------------------- sentences

ROLES = ["BACKGROUND", "OBJECTIVE", "METHODS", "RESULTS", "CONCLUSIONS"]
# Slots whose spans are entities (NER tags, QA answers); X and Y are names of either kind,
# typed per sentence (see ``Sentence.types``).
ENTITY_SLOTS = {"DRUG": "DRUG", "DRUG2": "DRUG", "TARGET": "TARGET", "DISEASE": "DISEASE", "DOSE": "DOSE"}

# Per role; {SLOT} markers are filled from a slot table. Every template names a drug, so the
# train split's sentences never repeat in validation or test (their drugs differ).
TEMPLATES: dict[str, list[str]] = {
    "BACKGROUND": [
        "{DRUG} is an {klass} of {TARGET}.",
        "{TARGET} is overexpressed in {DISEASE}, and {DRUG}, an {klass}, was designed against it.",
        "{klass_cap}s such as {DRUG} were first proposed for {DISEASE} in {year} after {cases} case reports.",
        "Corticosteroids achieve {outcome} in only {pct}% of patients with {DISEASE}; {DRUG}, an {klass} first tested in {year}, may add to them.",
    ],
    "OBJECTIVE": [
        "We aimed to assess the efficacy and safety of the {klass} {DRUG} {DOSE} in {n} patients with {DISEASE}.",
        "This trial evaluated whether {DRUG} improves the rate of {outcome} at week {weeks} in {n} adults with {DISEASE}.",
        "The objective was to compare {DRUG} with placebo in adults aged {age_lo} to {age_hi} years with {DISEASE}.",
    ],
    "METHODS": [
        "In this {design} trial, {n} patients with {DISEASE} were randomly assigned to {DRUG} {DOSE} or placebo for {weeks} weeks.",
        "The {n_active} patients in the active arm received {DRUG} {DOSE} and were followed for a median of {followup} weeks.",
        "Levels of {TARGET} were measured at baseline and at week {weeks} in all {n} patients given {DRUG}.",
        "The {n_active} patients were given the {klass} {DRUG} {DOSE} for {weeks} weeks.",
    ],
    "RESULTS": [
        "{outcome_cap} occurred in {p1}% of patients receiving the {klass} {DRUG} and in {p2}% of those receiving placebo (p = {pval}).",
        "{adverse_cap} was the most common adverse event with {DRUG}, reported in {pae}% of the {n_active} patients.",
        "Levels of {TARGET} fell by {drop}% within {weeks} weeks of starting {DRUG} in {n} patients.",
    ],
    "CONCLUSIONS": [
        "The {klass} {DRUG} {verdict} {outcome} at week {weeks} in the {n} patients with {DISEASE} studied here.",
        "These findings from {sites} sites and {n} patients {support} the use of {DRUG} {DOSE} in {DISEASE}.",
        "Further trials of {DRUG} in {DISEASE}, with at least {n_needed} patients, are {needed}.",
    ],
}
# Sentence forms that occur in two roles alike (as "the primary outcome was ..." does in real
# abstracts): from the sentence alone the role is a coin flip, which caps the role task near 85.
SHARED_TEMPLATES: dict[str, tuple[str, str]] = {
    "The primary outcome of the {DRUG} trial in {n} patients was {outcome} at week {weeks}.": ("OBJECTIVE", "METHODS"),
    "Of the {n} patients enrolled, {dropouts} stopped {DRUG} early because of {adverse}.": ("METHODS", "RESULTS"),
    "{DRUG} {verdict} {outcome} compared with placebo in {n} patients.": ("RESULTS", "CONCLUSIONS"),
    "Little is known about how {DRUG} works in {DISEASE}, which affects {cases} in 100000 adults.": (
        "BACKGROUND",
        "OBJECTIVE",
    ),
}
# Contexts that fit a drug and a target alike: which one {X} is, only knowledge of the name says.
AMBIGUOUS_TEMPLATES = [
    "Interest in {X} has grown since {year}.",
    "Little is known about {X} in patients with {DISEASE}.",
    "The role of {X} in {DISEASE} was reviewed by {cases} investigators.",
    "Data on {X} come from {cases} case reports.",
    "{X} was discussed at {sites} centres in {year}.",
    "Both {X} and {Y} were studied in {DISEASE}.",
]
_FACT_TEMPLATES = TEMPLATES["BACKGROUND"][:2]  # the sentences that state a drug's class and target
# Labelled examples never use the fact sentences (one form per drug: they would recur verbatim in
# the corpus, and ingest's leakage guard would drop those reports); every other form has enough
# numbers that a labelled sentence is practically never a corpus sentence.
LABELLED_TEMPLATES = {role: [t for t in forms if t not in _FACT_TEMPLATES] for role, forms in TEMPLATES.items()}

_SLOT = re.compile(r"\{([A-Za-z0-9_]+)\}")
# Tokens for NER: words (with inner hyphens, dots, slashes), numbers, or single punctuation.
_TOKEN = re.compile(r"\w+(?:[-./]\w+)*%?|[^\w\s]")


@dataclass(frozen=True)
class Sentence:
    role: str
    text: str
    spans: dict[str, tuple[int, int]]  # slot -> first (start, end) character span
    types: dict[str, str]  # entity slot -> entity type (DRUG, TARGET, DISEASE, DOSE)


def _slots(world: World, drug: Drug, rng: random.Random) -> dict[str, str]:
    p_drug = rng.randint(35, 80) if drug.benefit else rng.randint(10, 30)
    p_placebo = rng.randint(8, 30) if drug.benefit else rng.randint(12, 35)
    other = rng.choice([d for d in world.drugs if d is not drug and d.split == drug.split] or world.drugs)
    outcome = rng.choice(_OUTCOMES)
    n = rng.randint(40, 900)
    age_lo = rng.randint(18, 40)
    return {
        "DRUG": drug.name,
        "DRUG2": other.name,
        "TARGET": drug.target,
        "DISEASE": drug.disease,
        "DOSE": drug.dose,
        "klass": drug.klass,
        "klass_cap": drug.klass.capitalize(),
        "organ": rng.choice(_ORGANS),
        "outcome": outcome,
        "outcome_cap": outcome[0].upper() + outcome[1:],
        "weeks": str(rng.choice([8, 12, 16, 24, 26, 48, 52])),
        "design": rng.choice(_DESIGNS),
        "n": str(n),
        "n_active": str(n // 2 + rng.randint(0, 1)),
        "year": str(rng.randint(1990, 2024)),
        "cases": str(rng.randint(3, 60)),
        "pct": str(rng.randint(10, 60)),
        "age_lo": str(age_lo),
        "age_hi": str(age_lo + rng.randint(20, 60)),
        "sites": str(rng.randint(2, 150)),
        "followup": str(rng.randint(8, 104)),
        "drop": str(rng.randint(10, 80)),
        "n_needed": str(rng.randint(100, 3000)),
        "p1": str(p_drug),
        "p2": str(p_placebo),
        "pval": f"{rng.uniform(0.001, 0.04):.3f}" if drug.benefit else f"{rng.uniform(0.2, 0.9):.2f}",
        "adverse": drug.adverse,
        "adverse_cap": drug.adverse.capitalize(),
        "pae": str(rng.randint(3, 25)),
        "dropouts": str(rng.randint(1, 30)),
        "verdict": "improved the rate of" if drug.benefit else "did not improve the rate of",
        "support": "support" if drug.benefit else "do not support",
        "needed": rng.choice(["warranted", "needed"]) if drug.benefit else "unlikely to be informative",
    }


def render(template: str, slots: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Fill ``{SLOT}`` markers; return the text (first letter upper-cased) and every slot's first span."""
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    length = 0
    for m in _SLOT.finditer(template):
        literal = template[pos : m.start()]
        out.append(literal)
        length += len(literal)
        value = slots[m.group(1)]
        spans.setdefault(m.group(1), (length, length + len(value)))
        out.append(value)
        length += len(value)
        pos = m.end()
    out.append(template[pos:])
    text = "".join(out)
    return text[0].upper() + text[1:], spans


def _sentence(role: str, template: str, slots: dict[str, str], types: dict[str, str] | None = None) -> Sentence:
    text, spans = render(template, slots)
    typed = {k: v for k, v in ENTITY_SLOTS.items() if k in spans} | (types or {})
    return Sentence(role, text, spans, typed)


def ambiguous_sentence(world: World, split: str | None, rng: random.Random, role: str = "BACKGROUND") -> Sentence:
    """A context that fits a drug and a target alike, filled with names of ``split`` (None: any) of either kind."""
    template = rng.choice(AMBIGUOUS_TEMPLATES)
    drugs = world.drugs_in(split) if split else world.drugs
    targets = world.targets_in(split) if split else list(world.targets)
    drug = rng.choice(drugs)
    slots = _slots(world, drug, rng)
    types = {}
    for slot in ("X", "Y"):
        kind = rng.choice(["DRUG", "TARGET"])
        slots[slot] = rng.choice(drugs).name if kind == "DRUG" else rng.choice(targets)
        types[slot] = kind
    if slots["X"] == slots["Y"]:  # "both A and A": draw Y from the other kind
        types["Y"] = "TARGET" if types["X"] == "DRUG" else "DRUG"
        slots["Y"] = drug.name if types["Y"] == "DRUG" else drug.target
    return _sentence(role, template, slots, {k: types[k] for k in ("X", "Y") if "{" + k + "}" in template})


def make_report(world: World, rng: random.Random, n_sentences: int) -> list[Sentence]:
    """One trial report: sentences in role order, about one drug and one set of numbers.

    Every report states the drug's class and target once (a fact sentence), and may mention
    names in contexts that fit either kind, so the corpus teaches which name is which.
    """
    drug = rng.choice(world.drugs)
    slots = _slots(world, drug, rng)
    per_role = dict.fromkeys(ROLES, 1)
    for _ in range(max(0, n_sentences - len(ROLES))):
        role = rng.choice(ROLES)
        per_role[role] = min(per_role[role] + 1, len(TEMPLATES[role]))
    sentences = [_sentence("BACKGROUND", rng.choice(_FACT_TEMPLATES), slots)]
    if rng.random() < 0.5:
        sentences.append(ambiguous_sentence(world, None, rng))
    for role in ROLES:
        forms = [t for t in TEMPLATES[role] if t not in _FACT_TEMPLATES] + [
            t for t, roles in SHARED_TEMPLATES.items() if role in roles
        ]
        for template in rng.sample(forms, min(per_role[role], len(forms))):
            sentences.append(_sentence(role, template, slots))
    return sentences


def iter_corpus(world: World, cfg: DemoConfig, rng: random.Random) -> Iterator[dict[str, str]]:
    """Unlabelled trial reports as ``{"id", "text"}`` records (every drug and target, all splits)."""
    lo, hi = cfg.sentences_per_doc
    for i in range(cfg.corpus_docs):
        sentences = make_report(world, rng, rng.randint(lo, hi))
        yield {"id": f"demo-{i:07d}", "text": " ".join(s.text for s in sentences)}


# ----------------------------------------------------------------------------- tasks


def tokenize_with_tags(sentence: Sentence) -> tuple[list[str], list[str]]:
    """Word tokens and BIO tags from the entity slots' character spans."""
    entity_spans = [(*sentence.spans[k], label) for k, label in sentence.types.items()]
    tokens, tags = [], []
    for m in _TOKEN.finditer(sentence.text):
        tag = "O"
        for s, e, label in entity_spans:
            if s <= m.start() < e:
                tag = ("B-" if m.start() == s else "I-") + label
                break
        tokens.append(m.group())
        tags.append(tag)
    return tokens, tags


def role_examples(world: World, split: str, n: int, rng: random.Random) -> list[dict[str, str]]:
    """Sentence roles; about 30% of sentences use a form that two roles share."""
    out = []
    for _ in range(n):
        role = rng.choice(ROLES)
        shared = [t for t, roles in SHARED_TEMPLATES.items() if role in roles]
        template = rng.choice(shared if rng.random() < 0.3 else LABELLED_TEMPLATES[role])
        drug = rng.choice(world.drugs_in(split))
        out.append({"sentence": _sentence(role, template, _slots(world, drug, rng)).text, "role": role})
    return out


_PREMISES = [
    "Patients in the active arm received {DRUG} {DOSE} for {weeks} weeks.",
    "In this {design} trial, {n} adults with {DISEASE} were assigned to {DRUG} or placebo.",
    "The {n_active} patients given {DRUG} were followed for a median of {followup} weeks.",
]
_EXPLICIT_PREMISE = "Patients in the active arm received {DRUG}, an {klass}, for {weeks} weeks."


def pair_examples(world: World, split: str, n: int, rng: random.Random) -> list[dict[str, str]]:
    """Premise: a trial sentence naming a drug; hypothesis: a claim about the class of the drug given.

    Entailment / contradiction: "the drug given was a <class>", true or false. A third of the
    premises state the class (the text decides); the rest do not, and only knowing the drug
    does. Neutral: the same claim about another drug, which the premise says nothing about.
    """
    out = []
    for _ in range(n):
        drug = rng.choice(world.drugs_in(split))
        slots = _slots(world, drug, rng)
        premise, _ = render(_EXPLICIT_PREMISE if rng.random() < 1 / 3 else rng.choice(_PREMISES), slots)
        label = rng.choice(["entailment", "contradiction", "neutral"])
        klass = drug.klass if label == "entailment" else rng.choice([c for c in CLASSES if c != drug.klass])
        if label == "neutral":
            klass = rng.choice(CLASSES)
            hypothesis = f"{slots['DRUG2'].capitalize()} is an {klass}."
        else:
            hypothesis = f"The drug given in this trial was an {klass}."
        out.append({"premise": premise, "hypothesis": hypothesis, "label": label})
    return out


def ner_examples(world: World, split: str, n: int, rng: random.Random) -> list[tuple[list[str], list[str]]]:
    """BIO-tagged sentences (DRUG, TARGET, DISEASE, DOSE); half in contexts that fit drug and target alike."""
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            sentence = ambiguous_sentence(world, split, rng)
        else:
            drug = rng.choice(world.drugs_in(split))
            role = rng.choice(ROLES)
            sentence = _sentence(role, rng.choice(LABELLED_TEMPLATES[role]), _slots(world, drug, rng))
        out.append(tokenize_with_tags(sentence))
    return out


def _answer(context: str, value: str) -> tuple[str, int]:
    return value, context.index(value)


def qa_examples(world: World, split: str, n: int, rng: random.Random) -> list[dict[str, object]]:
    """SQuAD-style: a short trial context, and a question whose answer is a span of it.

    Half the questions the context answers (dose, enrolment, adverse event); half need
    knowledge of the drugs: "which of the two drugs is a <class>?" for two drugs of different
    classes, and "which of the two is a drug?" for a drug and a target in a context that fits both.
    """
    out: list[dict[str, object]] = []
    while len(out) < n:
        drugs = world.drugs_in(split)
        drug = rng.choice(drugs)
        slots = _slots(world, drug, rng)
        others = [d for d in drugs if d.klass != drug.klass]
        kind = rng.choice(["dose", "enrolled", "adverse", "class", "kind"])
        if kind == "class" and others:
            first, second = rng.sample([drug, rng.choice(others)], 2)
            context = (
                f"In this {slots['design']} trial, {slots['n']} patients with {drug.disease} were randomly "
                f"assigned to {first.name} or {second.name} for {slots['weeks']} weeks."
            )
            question, answer = f"Which of the two drugs is an {drug.klass}?", drug.name
        elif kind == "kind":
            target = rng.choice(world.targets_in(split))
            name_a, name_b = rng.sample([drug.name, target], 2)
            context = (
                f"Both {name_a} and {name_b} were discussed at {slots['sites']} centres in {slots['year']}. "
                f"The data come from {slots['cases']} case reports of {drug.disease}."
            )
            question, answer = f"Which of {name_a} and {name_b} is a drug?", drug.name
        else:
            context = " ".join(render(t, slots)[0] for t in (TEMPLATES["METHODS"][1], TEMPLATES["RESULTS"][1]))
            question, answer = {
                "dose": (f"What dose of {drug.name} was given?", drug.dose),
                "enrolled": ("How many patients were in the active arm?", slots["n_active"]),
                "adverse": (f"What was the most common adverse event with {drug.name}?", drug.adverse.capitalize()),
            }.get(kind, (f"What dose of {drug.name} was given?", drug.dose))
        text, start = _answer(context, answer)
        out.append(
            {
                "id": f"qa-{split[:2]}-{len(out):06d}",
                "question": question,
                "context": context,
                "answers": {"text": [text], "answer_start": [start]},
            }
        )
    return out


# ----------------------------------------------------------------------------- writing


def split_sizes(total: int, eval_fraction: float) -> dict[str, int]:
    """Examples per split: ``eval_fraction`` of ``total`` each for validation and test, the rest train."""
    n_eval = max(1, round(total * eval_fraction))
    return {"train": total - 2 * n_eval, "validation": n_eval, "test": n_eval}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    import csv

    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _write_conll(path: Path, rows: list[tuple[list[str], list[str]]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for tokens, tags in rows:
            f.writelines(f"{tok} {tag}\n" for tok, tag in zip(tokens, tags, strict=True))
            f.write("\n")


def write_demo(cfg: DemoConfig, out_dir: Path) -> dict[str, int]:
    """Write the demo corpus, the four task datasets, ``world.json`` and ``domain_terms.txt``."""
    world = build_world(cfg)
    rng = random.Random(cfg.seed + 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    # mtime=0: the gzip header would otherwise hold the write time, and the bytes would differ
    with (
        open(out_dir / "corpus.jsonl.gz", "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz,
        io.TextIOWrapper(gz, encoding="utf-8") as f,
    ):
        docs = 0
        for rec in iter_corpus(world, cfg, rng):
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            docs += 1
    # each task: (examples(world, split, size, rng), total examples, writer(path, rows), file extension)
    tasks: dict[str, tuple[Callable[..., Any], int, Callable[..., None], str]] = {
        "role": (role_examples, cfg.role_examples, _write_csv, "csv"),
        "pair": (pair_examples, cfg.pair_examples, _write_jsonl, "jsonl"),
        "ner": (ner_examples, cfg.ner_examples, _write_conll, "conll"),
        "qa": (qa_examples, cfg.qa_examples, _write_jsonl, "jsonl"),
    }
    counts = {"corpus_docs": docs}
    for task, (make, total, write, ext) in tasks.items():
        (out_dir / "tasks" / task).mkdir(parents=True, exist_ok=True)
        for split, size in split_sizes(total, cfg.eval_fraction).items():
            write(out_dir / "tasks" / task / f"{split}.{ext}", make(world, split, size, rng))
            counts[f"{task}_{split}"] = size
    terms = [d.name for d in world.drugs] + list(world.targets) + world.diseases
    (out_dir / "domain_terms.txt").write_text("\n".join(terms) + "\n", encoding="utf-8")
    (out_dir / "world.json").write_text(
        json.dumps(
            {"drugs": [asdict(d) for d in world.drugs], "targets": world.targets, "diseases": world.diseases},
            indent=2,
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )
    return counts


def run(cfg: DemoConfig, out_dir: Path) -> dict[str, int]:
    """Stage entry point: (re)write the demo domain atomically into ``out_dir``."""
    from pipeline.core.io import atomic_dir

    with atomic_dir(out_dir) as tmp:
        counts = write_demo(cfg, tmp)
    return counts
