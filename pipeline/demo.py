"""The embedded default domain: seeded, synthetic pharmacology trial reports.

Everything here is invented (drug and disease names, doses, outcomes) but consistent: each
drug has one class, one target disease, one dose and one true effect, and every report, task
example and answer agrees with them. The invented names are split into several WordPiece
pieces by a general English vocab, so domain adaptation and vocab extension have something
to learn. ``write_demo`` writes the corpus and the four labelled tasks as ordinary files
(gzipped JSONL, CSV, JSONL, CoNLL) that ``ingest`` then reads like any user data.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.config import DemoConfig

# ----------------------------------------------------------------------------- the world

_ONSETS = ["zor", "quel", "tef", "vix", "dral", "mop", "kest", "ulv", "pram", "brix", "sel", "nor", "fen",
           "oxa", "tar", "lum", "cav", "rid", "gal", "hes", "yob", "plen", "trov", "sarn"]
_MIDDLES = ["va", "pra", "lo", "ti", "xe", "mu", "ra", "do", "ne", "si", "qui", "zo"]
_CLASSES = {  # suffix -> class description
    "tinib": "kinase inhibitors", "mab": "monoclonal antibodies", "prazole": "proton pump blockers",
    "vir": "polymerase antivirals", "vastatin": "reductase inhibitors", "olol": "adrenergic blockers",
}
_DISEASE_ADJ = ["cryptal", "dorsolytic", "pelvoid", "vasculent", "myxoid", "thalamic", "renoform",
                "glandrous", "ostemic", "lymphoblastoid", "cortivalent", "spinotic"]
_DISEASE_NOUN = ["myelitis", "fasciitis", "anaemia", "neuropathy", "dermatosis", "arteritis",
                 "nephrosis", "carditis", "sclerosis", "hepatopathy"]
_EPONYMS = ["Harlow", "Venner", "Tarsik", "Okonkwo", "Brandvold", "Quist", "Maelor", "Ilves", "Dumitrescu", "Feyling"]
_ORGANS = ["renal", "hepatic", "neuromuscular", "cutaneous", "cardiac", "haematological", "pulmonary"]
_OUTCOMES = ["complete remission", "symptom resolution", "a 50% reduction in flare frequency",
             "normalisation of serum markers", "sustained clinical response", "freedom from relapse"]
_ADVERSE = ["nausea", "headache", "transient neutropenia", "elevated transaminases", "rash", "fatigue",
            "peripheral oedema", "insomnia"]
_FREQ = ["once daily", "twice daily", "every two weeks", "weekly", "three times daily"]
_UNITS = ["mg", "mg/kg", "µg", "mL"]
_DESIGNS = ["double-blind", "open-label", "placebo-controlled", "multicentre", "single-centre"]

ROLES = ["BACKGROUND", "OBJECTIVE", "METHODS", "RESULTS", "CONCLUSIONS"]
ENTITY_SLOTS = {"DRUG": "DRUG", "DRUG2": "DRUG", "DISEASE": "DISEASE", "DOSE": "DOSE"}

# Templates per role; {SLOT} markers are filled from a slot table, and the spans of entity
# slots (DRUG, DISEASE, DOSE) become NER tags and QA answers.
TEMPLATES: dict[str, list[str]] = {
    "BACKGROUND": [
        "{DISEASE} is a {severity} {organ} disorder that affects about {prev} in 100000 adults.",
        "Current treatment of {DISEASE} relies on corticosteroids, which achieve {outcome} in only {pct}% of patients.",
        "{klass_cap} such as {DRUG} were first proposed for {DISEASE} in {year} after {cases} case reports.",
        "About {relapse}% of patients with {DISEASE} relapse within {weeks} weeks of stopping therapy.",
    ],
    "OBJECTIVE": [
        "We aimed to assess the efficacy and safety of {DRUG} {DOSE} in {n} patients with {DISEASE}.",
        "This trial evaluated whether {DRUG} improves the rate of {outcome} at week {weeks} in {n} adults with {DISEASE}.",
        "The objective was to compare {DRUG} with placebo in adults aged {age_lo} to {age_hi} years with {DISEASE}.",
    ],
    "METHODS": [
        "In this {design} trial, {n} patients with {DISEASE} were randomly assigned to {DRUG} {DOSE} or placebo for {weeks} weeks.",
        "The primary outcome, {outcome} at week {weeks}, was assessed in {n} patients at {sites} sites.",
        "The {n_active} patients in the active arm received {DRUG} {DOSE} and were followed for a median of {followup} weeks.",
        "Randomisation at {sites} sites was stratified by {organ} involvement and a baseline severity score above {score}.",
    ],
    "RESULTS": [
        "{outcome_cap} occurred in {p1}% of patients receiving {DRUG} and in {p2}% of those receiving placebo (p = {pval}).",
        "{adverse_cap} was the most common adverse event with {DRUG}, reported in {pae}% of the {n_active} patients.",
        "Among the {n} patients enrolled, {dropouts} discontinued {DRUG} because of {adverse}.",
    ],
    "CONCLUSIONS": [
        "{DRUG} {verdict} {outcome} at week {weeks} in the {n} patients with {DISEASE} studied here.",
        "These findings from {sites} sites {support} the use of {DRUG} {DOSE} in {DISEASE}.",
        "Further trials of {DRUG} in {DISEASE}, with at least {n_needed} patients, are {needed}.",
    ],
}

_SLOT = re.compile(r"\{([A-Za-z0-9_]+)\}")
# Tokens for NER: words (with inner hyphens, dots, slashes), numbers, or single punctuation.
_TOKEN = re.compile(r"\w+(?:[-./]\w+)*%?|[^\w\s]")


@dataclass(frozen=True)
class Drug:
    name: str
    klass: str
    disease: str
    dose: str
    benefit: bool
    adverse: str


@dataclass(frozen=True)
class World:
    drugs: list[Drug]
    diseases: list[str]


def _invent_names(rng: random.Random, count: int, make) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = make()
        if name not in names:
            names.append(name)
    return names


def build_world(cfg: DemoConfig) -> World:
    """The fixed facts of the fictional domain, a pure function of ``cfg.seed``."""
    rng = random.Random(cfg.seed)

    def disease() -> str:
        if rng.random() < 0.3:
            return f"{rng.choice(_EPONYMS)}-{rng.choice(_EPONYMS)} {rng.choice(['syndrome', 'disease'])}"
        return f"{rng.choice(_DISEASE_ADJ)} {rng.choice(_DISEASE_NOUN)}"

    diseases = _invent_names(rng, cfg.diseases, disease)
    suffixes = list(_CLASSES)
    drug_names = _invent_names(rng, cfg.drugs, lambda: rng.choice(_ONSETS) + rng.choice(_MIDDLES) + rng.choice(suffixes))
    drugs = []
    for name in drug_names:
        suffix = next(s for s in suffixes if name.endswith(s))
        amount = rng.choice([0.5, 1, 2.5, 5, 10, 20, 40, 80, 150, 300])
        amount_text = f"{amount:g}"
        dose = f"{amount_text} {rng.choice(_UNITS)} {rng.choice(_FREQ)}"
        drugs.append(Drug(name, _CLASSES[suffix], rng.choice(diseases), dose, rng.random() < 0.6, rng.choice(_ADVERSE)))
    return World(drugs, diseases)


# ----------------------------------------------------------------------------- sentences


@dataclass(frozen=True)
class Sentence:
    role: str
    text: str
    spans: dict[str, tuple[int, int]]  # slot -> first (start, end) character span


def _slots(world: World, drug: Drug, rng: random.Random) -> dict[str, str]:
    p_drug = rng.randint(35, 80) if drug.benefit else rng.randint(10, 30)
    p_placebo = rng.randint(8, 30) if drug.benefit else rng.randint(12, 35)
    other = rng.choice([d for d in world.drugs if d is not drug])
    outcome = rng.choice(_OUTCOMES)
    n = rng.randint(40, 900)
    age_lo = rng.randint(18, 40)
    return {
        "DRUG": drug.name, "DRUG2": other.name, "DISEASE": drug.disease, "DOSE": drug.dose,
        "klass_cap": drug.klass.capitalize(), "severity": rng.choice(["chronic", "progressive", "rare", "relapsing"]),
        "organ": rng.choice(_ORGANS), "prev": str(rng.randint(2, 90)), "outcome": outcome,
        "outcome_cap": outcome[0].upper() + outcome[1:], "weeks": str(rng.choice([8, 12, 16, 24, 26, 48, 52])),
        "design": rng.choice(_DESIGNS), "n": str(n), "n_active": str(n // 2 + rng.randint(0, 1)),
        "pct": str(rng.randint(10, 60)), "year": str(rng.randint(1990, 2024)), "cases": str(rng.randint(3, 60)),
        "relapse": str(rng.randint(15, 75)), "age_lo": str(age_lo), "age_hi": str(age_lo + rng.randint(20, 60)),
        "sites": str(rng.randint(2, 150)), "followup": str(rng.randint(8, 104)), "score": str(rng.randint(2, 30)),
        "n_needed": str(rng.randint(100, 3000)), "p1": str(p_drug), "p2": str(p_placebo),
        "pval": f"{rng.uniform(0.001, 0.04):.3f}" if drug.benefit else f"{rng.uniform(0.2, 0.9):.2f}",
        "adverse": drug.adverse, "adverse_cap": drug.adverse.capitalize(), "pae": str(rng.randint(3, 25)),
        "dropouts": str(rng.randint(1, 30)),
        "verdict": "improved the rate of" if drug.benefit else "did not improve the rate of",
        "support": "support" if drug.benefit else "do not support",
        "needed": rng.choice(["warranted", "needed"]) if drug.benefit else "unlikely to be informative",
    }


def render(template: str, slots: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Fill ``{SLOT}`` markers; return the text and the first span of every slot."""
    out: list[str] = []
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    length = 0
    for m in _SLOT.finditer(template):
        literal = template[pos:m.start()]
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


def make_sentence(world: World, drug: Drug, role: str, rng: random.Random, slots: dict[str, str] | None = None) -> Sentence:
    text, spans = render(rng.choice(TEMPLATES[role]), slots or _slots(world, drug, rng))
    return Sentence(role, text, spans)


def make_report(world: World, rng: random.Random, n_sentences: int) -> list[Sentence]:
    """One trial report: sentences in role order, all about one drug and one set of numbers."""
    drug = rng.choice(world.drugs)
    slots = _slots(world, drug, rng)
    # every role appears once; extra sentences go to random roles, each template at most once
    per_role = dict.fromkeys(ROLES, 1)
    for _ in range(max(0, n_sentences - len(ROLES))):
        role = rng.choice(ROLES)
        per_role[role] = min(per_role[role] + 1, len(TEMPLATES[role]))
    sentences = []
    for role in ROLES:
        for template in rng.sample(TEMPLATES[role], per_role[role]):
            text, spans = render(template, slots)
            sentences.append(Sentence(role, text, spans))
    return sentences[:max(n_sentences, 1)]


def iter_corpus(world: World, cfg: DemoConfig, rng: random.Random) -> Iterator[dict[str, str]]:
    """Unlabelled trial reports as ``{"id", "text"}`` records."""
    lo, hi = cfg.sentences_per_doc
    for i in range(cfg.corpus_docs):
        sentences = make_report(world, rng, rng.randint(lo, hi))
        yield {"id": f"demo-{i:07d}", "text": " ".join(s.text for s in sentences)}


# ----------------------------------------------------------------------------- tasks


def tokenize_with_tags(text: str, spans: dict[str, tuple[int, int]]) -> tuple[list[str], list[str]]:
    """Word tokens and BIO tags from the entity slots' character spans."""
    entity_spans = [(s, e, ENTITY_SLOTS[k]) for k, (s, e) in spans.items() if k in ENTITY_SLOTS]
    tokens, tags = [], []
    for m in _TOKEN.finditer(text):
        tag = "O"
        for s, e, label in entity_spans:
            if s <= m.start() < e:
                tag = ("B-" if m.start() == s else "I-") + label
                break
        tokens.append(m.group())
        tags.append(tag)
    return tokens, tags


def role_examples(world: World, n: int, rng: random.Random) -> list[dict[str, str]]:
    out = []
    for _ in range(n):
        role = rng.choice(ROLES)
        out.append({"sentence": make_sentence(world, rng.choice(world.drugs), role, rng).text, "role": role})
    return out


def pair_examples(world: World, n: int, rng: random.Random) -> list[dict[str, str]]:
    """Premise: a results sentence with numbers; hypothesis: a claim it entails, contradicts or ignores."""
    out = []
    for _ in range(n):
        drug = rng.choice(world.drugs)
        slots = _slots(world, drug, rng)
        premise, _ = render(TEMPLATES["RESULTS"][0], slots)
        better = int(slots["p1"]) > int(slots["p2"])
        kind = rng.choice(["drug", "placebo", "other"])
        if kind == "drug":
            hypothesis, label = f"{drug.name} was more effective than placebo.", "entailment" if better else "contradiction"
        elif kind == "placebo":
            hypothesis, label = f"Placebo was more effective than {drug.name}.", "contradiction" if better else "entailment"
        else:
            hypothesis, label = f"{slots['DRUG2']} was more effective than placebo.", "neutral"
        out.append({"premise": premise, "hypothesis": hypothesis, "label": label})
    return out


def ner_examples(world: World, n: int, rng: random.Random) -> list[tuple[list[str], list[str]]]:
    out = []
    while len(out) < n:
        s = make_sentence(world, rng.choice(world.drugs), rng.choice(ROLES), rng)
        tokens, tags = tokenize_with_tags(s.text, s.spans)
        if any(t != "O" for t in tags) or rng.random() < 0.1:  # mostly sentences with entities
            out.append((tokens, tags))
    return out


_QUESTIONS = {
    "DOSE": "What dose of {DRUG} was given?",
    "DISEASE": "Which condition did the trial of {DRUG} study?",
    "n": "How many patients were enrolled?",
    "adverse": "What was the most common adverse event with {DRUG}?",
    "weeks": "For how many weeks were patients followed?",
}


def qa_examples(world: World, n: int, rng: random.Random) -> list[dict[str, object]]:
    """SQuAD-style examples: a short report as context, a question whose answer is a slot span."""
    out: list[dict[str, object]] = []
    while len(out) < n:
        sentences = make_report(world, rng, rng.randint(5, 7))
        context, offset, spans = "", 0, {}
        for s in sentences:
            if context:
                context += " "
                offset += 1
            for k, (a, b) in s.spans.items():
                spans.setdefault(k, (offset + a, offset + b))
            context += s.text
            offset += len(s.text)
        askable = [k for k in _QUESTIONS if k in spans]
        key = rng.choice(askable)
        a, b = spans[key]
        drug = context[spans["DRUG"][0]:spans["DRUG"][1]]  # every report has an OBJECTIVE naming it
        question = _QUESTIONS[key].format(DRUG=drug)
        out.append({"id": f"qa-{len(out):06d}", "question": question, "context": context,
                    "answers": {"text": [context[a:b]], "answer_start": [a]}})
    return out


# ----------------------------------------------------------------------------- writing


def _split(items: list, eval_fraction: float) -> dict[str, list]:
    n_eval = max(1, round(len(items) * eval_fraction))
    return {"train": items[2 * n_eval:], "validation": items[:n_eval], "test": items[n_eval:2 * n_eval]}


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
    with open(out_dir / "corpus.jsonl.gz", "wb") as raw, \
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as f:
        docs = 0
        for rec in iter_corpus(world, cfg, rng):
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
            docs += 1
    writers = {
        "role": (role_examples(world, cfg.role_examples, rng), _write_csv, "csv"),
        "pair": (pair_examples(world, cfg.pair_examples, rng), _write_jsonl, "jsonl"),
        "ner": (ner_examples(world, cfg.ner_examples, rng), _write_conll, "conll"),
        "qa": (qa_examples(world, cfg.qa_examples, rng), _write_jsonl, "jsonl"),
    }
    counts = {"corpus_docs": docs}
    for task, (rows, write, ext) in writers.items():
        (out_dir / "tasks" / task).mkdir(parents=True, exist_ok=True)
        for split, part in _split(rows, cfg.eval_fraction).items():
            write(out_dir / "tasks" / task / f"{split}.{ext}", part)
            counts[f"{task}_{split}"] = len(part)
    terms = [d.name for d in world.drugs] + world.diseases
    (out_dir / "domain_terms.txt").write_text("\n".join(terms) + "\n", encoding="utf-8")
    (out_dir / "world.json").write_text(json.dumps(
        {"drugs": [asdict(d) for d in world.drugs], "diseases": world.diseases}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return counts


def run(cfg: DemoConfig, out_dir: Path) -> dict[str, int]:
    """Stage entry point: (re)write the demo domain atomically into ``out_dir``."""
    from pipeline.io import atomic_dir

    with atomic_dir(out_dir) as tmp:
        counts = write_demo(cfg, tmp)
    return counts
