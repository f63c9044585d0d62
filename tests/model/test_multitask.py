"""The multi-task model's parts on a tiny BERT: heads, losses, sampler, LLRD groups, batching, decoding."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertConfig, BertModel

from pipeline.core.sections.finetune import FinetuneTaskConfig
from pipeline.tasks.base import class_weights, pad_features
from pipeline.tasks.registry import REGISTRY
from pipeline.tasks.spec import TaskSpec
from pipeline.training.multitask import (
    MultiTaskBatchSampler,
    MultiTaskModel,
    head_shapes_problem,
    length_bucketed_batches,
    llrd_param_groups,
    plan_steps,
    task_probabilities,
)

VOCAB = 60


def tiny_encoder(layers: int = 2) -> BertModel:
    torch.manual_seed(0)
    return BertModel(
        BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=layers,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        ),
        add_pooling_layer=False,
    )


SPECS = [
    TaskSpec("seq", "sequence_classification", ["a", "b", "c"], FinetuneTaskConfig(pooling="mean")),
    TaskSpec("pair", "pair_classification", ["yes", "no"], FinetuneTaskConfig()),
    TaskSpec("ner", "token_classification", ["O", "B-X", "I-X"], FinetuneTaskConfig()),
    TaskSpec("qa", "extractive_qa", [], FinetuneTaskConfig()),
]


def batch_for(task: str, n: int = 8, length: int = 10) -> dict[str, torch.Tensor]:
    """A fixed random batch whose targets are a function of the input (so they can be learnt)."""
    g = torch.Generator().manual_seed(1)
    features = []
    for i in range(n):
        ids = [2] + torch.randint(5, VOCAB, (length - 2 - i % 3,), generator=g).tolist() + [3]
        f = {"input_ids": ids, "token_type_ids": [0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2)}
        if task == "seq":
            f["labels"] = ids[1] % 3
        elif task == "pair":
            f["labels"] = ids[1] % 2
        elif task == "ner":
            f["labels"] = [-100] + [t % 3 for t in ids[1:-1]] + [-100]
        else:
            f["start_positions"], f["end_positions"] = 1 + ids[1] % 3, 2 + ids[1] % 3
        features.append(f)
    batch = pad_features(features, pad_id=0)
    batch["task"] = task
    return batch


def test_head_output_shapes() -> None:
    model = MultiTaskModel(tiny_encoder(), SPECS, dropout=0.1)
    expected = {"seq": (8, 3), "pair": (8, 2), "ner": (8, 10, 3), "qa": (8, 10, 2)}
    for task, shape in expected.items():
        out = model(**batch_for(task))
        assert tuple(out["logits"].shape) == shape
        assert out["loss"].ndim == 0 and torch.isfinite(out["loss"])


@pytest.mark.parametrize("task", ["seq", "pair", "ner", "qa"])
def test_loss_goes_down_for_each_task_type(task: str) -> None:
    model = MultiTaskModel(tiny_encoder(), SPECS, dropout=0.0)
    batch = batch_for(task)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = model(**batch)["loss"]
        losses.append(float(loss.detach()))
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert losses[-1] < 0.5 * losses[0], losses[::10]


def test_loss_weight_and_class_weights_enter_the_loss() -> None:
    plain = MultiTaskModel(tiny_encoder(), SPECS[:1], dropout=0.0)
    heavy = MultiTaskModel(
        tiny_encoder(),
        [
            TaskSpec(
                "seq", "sequence_classification", ["a", "b", "c"], FinetuneTaskConfig(pooling="mean", loss_weight=2.5)
            )
        ],
        dropout=0.0,
    )
    heavy.load_state_dict(plain.state_dict())
    plain.eval(), heavy.eval()  # no encoder dropout: the same forward pass twice
    b = batch_for("seq")
    with torch.no_grad():
        assert float(heavy(**b)["loss"]) == pytest.approx(2.5 * float(plain(**b)["loss"]), rel=1e-5)
    assert class_weights([0, 0, 0, 1], 3).tolist() == pytest.approx(
        [4 / 6, 4 / 2, 1.0]
    )  # n / (k * count), absent label -> 1
    assert class_weights([[-100, 0, 0, 1, -100]], 2).tolist() == pytest.approx([3 / 4, 3 / 2])


def test_llrd_learning_rates_by_hand() -> None:
    model = MultiTaskModel(tiny_encoder(layers=2), SPECS, dropout=0.1)
    groups = llrd_param_groups(model, lr=1e-3, decay=0.5, weight_decay=0.01)
    lr_of = {name: g["lr"] for g in groups for name in g["names"]}
    wd_of = {name: g["weight_decay"] for g in groups for name in g["names"]}
    # L = 2 layers: heads depth 3 -> 1e-3; layer 1 -> 5e-4; layer 0 -> 2.5e-4; embeddings -> 1.25e-4
    assert lr_of["heads.seq.out.weight"] == pytest.approx(1e-3)
    assert lr_of["encoder.encoder.layer.1.attention.self.query.weight"] == pytest.approx(5e-4)
    assert lr_of["encoder.encoder.layer.0.output.dense.weight"] == pytest.approx(2.5e-4)
    assert lr_of["encoder.embeddings.word_embeddings.weight"] == pytest.approx(1.25e-4)
    assert wd_of["encoder.embeddings.LayerNorm.weight"] == 0 and wd_of["heads.qa.out.bias"] == 0
    assert wd_of["encoder.encoder.layer.0.output.dense.weight"] == 0.01
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))  # every parameter, once
    assert groups[0]["lr"] == pytest.approx(1e-3)  # heads first: the logged LR is the full one


def test_sampler_proportions_over_10k_draws() -> None:
    sizes = {"a": 8000, "b": 2000, "c": 500}
    cases = {
        "proportional": {t: n / 10500 for t, n in sizes.items()},
        "temperature": {t: n**0.5 / sum(m**0.5 for m in sizes.values()) for t, n in sizes.items()},
        "fixed": {"a": 1 / 4, "b": 1 / 4, "c": 2 / 4},
    }
    for sampling, expected in cases.items():
        probs = task_probabilities(sizes, sampling, temperature=2.0, weights={"a": 1, "b": 1, "c": 2})
        assert probs == pytest.approx(expected)
        lengths = {t: np.full(n, 10) for t, n in sizes.items()}
        sampler = MultiTaskBatchSampler(lengths, probs, batch_size=4, bucket_batches=10, steps=10_000, seed=3)
        drawn = Counter(batch[0][0] for batch in sampler)
        for t, p in expected.items():
            assert drawn[t] / 10_000 == pytest.approx(p, abs=0.015), (sampling, t)
    assert task_probabilities(sizes, "temperature", temperature=1.0) == pytest.approx(cases["proportional"])


def test_an_epochs_budget_gives_every_task_its_passes_and_a_step_budget_starves_the_small_one() -> None:
    sizes = {"rct": 20_000, "ncbi": 5_432}
    shared = plan_steps(sizes, 16, 3000, None, "temperature", temperature=2.0)
    assert shared.max_steps == 3000 and shared.epochs["ncbi"] == pytest.approx(3.03, abs=0.01)
    plan = plan_steps(sizes, 16, 100_000, {"rct": 2.0, "ncbi": 10.0}, "temperature", temperature=2.0)
    assert plan.max_steps == 2500 + 3395  # 2 x 20000 / 16 + 10 x 5432 / 16
    assert plan.epochs == pytest.approx({"rct": 2.0, "ncbi": 10.0}, abs=0.01)
    capped = plan_steps(sizes, 16, 1000, {"rct": 2.0, "ncbi": 10.0}, "temperature")
    assert capped.max_steps == 1000 and capped.probs == plan.probs  # max_steps caps the run, the shares stay
    assert plan.capped() is None and shared.capped() is None
    assert "finetune.max_steps (1000) caps the epochs budget (5895 steps)" in str(capped.capped())
    assert "ncbi 10.0" in plan.describe()
    lengths = {t: np.full(n, 10) for t, n in sizes.items()}
    sampler = MultiTaskBatchSampler(lengths, plan.probs, batch_size=16, bucket_batches=10, steps=plan.max_steps, seed=3)
    drawn = Counter(batch[0][0] for batch in sampler)
    assert drawn["ncbi"] * 16 / sizes["ncbi"] == pytest.approx(10.0, rel=0.05)  # the passes it was promised


def test_batches_are_single_task_and_reproducible_per_epoch() -> None:
    lengths = {"a": np.arange(50) % 17 + 3, "b": np.arange(30) % 5 + 3}
    sampler = MultiTaskBatchSampler(lengths, {"a": 0.5, "b": 0.5}, batch_size=4, bucket_batches=3, steps=40, seed=7)
    first = list(sampler)
    assert all(len({t for t, _ in b}) == 1 for b in first)
    assert list(sampler) == first  # same epoch, same batches: resuming mid-epoch sees what it would have seen
    sampler.set_epoch(1)
    assert list(sampler) != first


def test_length_buckets_cover_every_example_once_and_pad_less() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 128, 2000)
    bucketed = length_bucketed_batches(lengths, 16, 50, np.random.default_rng(1))
    assert sorted(np.concatenate(bucketed).tolist()) == list(range(2000))
    random_batches = np.array_split(np.random.default_rng(1).permutation(2000), 125)
    padded = lambda batches: sum(len(b) * lengths[b].max() for b in batches)  # noqa: E731
    assert padded(bucketed) < 0.7 * padded(random_batches)


def test_dynamic_padding_pads_to_the_longest_in_the_batch() -> None:
    batch = pad_features(
        [{"input_ids": [2, 7, 3], "labels": [-100, 1, -100]}, {"input_ids": [2, 3], "labels": [-100, -100]}], pad_id=0
    )
    assert batch["input_ids"].tolist() == [[2, 7, 3], [2, 3, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 1, -100], [-100, -100, -100]]


def loop_best_span(features, logits, windows, context, n_best, max_len):  # HF run_qa's post-processing, as a loop
    best, best_score = ("", -1, -1), -np.inf
    for i in windows:
        starts_ok, ends_ok = np.asarray(features[i]["offset_start"]), np.asarray(features[i]["offset_end"])
        for s in np.argsort(logits[i][:, 0])[::-1][:n_best]:
            for e in np.argsort(logits[i][:, 1])[::-1][:n_best]:
                if starts_ok[s] < 0 or ends_ok[e] < 0 or e < s or e - s + 1 > max_len:
                    continue
                score = float(logits[i][s, 0] + logits[i][e, 1])
                if score > best_score:
                    best, best_score = (context[starts_ok[s] : ends_ok[e]], int(starts_ok[s]), int(ends_ok[e])), score
    return best, best_score


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    windows=st.integers(1, 3),
    tokens=st.integers(2, 24),
    n_best=st.integers(1, 8),
    max_len=st.integers(1, 6),
    levels=st.sampled_from([3, 1000]),  # 3: many tied scores (the first best pair must win, as in the loop)
)
def test_qa_decoding_picks_the_span_the_n_best_loop_picks(seed, windows, tokens, n_best, max_len, levels) -> None:
    from pipeline.tasks.extractive_qa import best_span

    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(tokens)]
    context = " ".join(words)
    starts = [sum(len(w) + 1 for w in words[:i]) for i in range(tokens)]  # character offsets of the words
    features, logits = [], []
    for _ in range(windows):
        question = rng.random(tokens) < 0.3  # question tokens and specials: offset -1
        features.append(
            {
                "offset_start": [-1 if q else s for q, s in zip(question, starts, strict=True)],
                "offset_end": [
                    -1 if q else s + len(f"w{i}") for i, (q, s) in enumerate(zip(question, starts, strict=True))
                ],
            }
        )
        logits.append(rng.integers(0, levels, (tokens, 2)).astype(np.float32))
    spec = TaskSpec("qa", "extractive_qa", [], FinetuneTaskConfig(n_best=n_best, max_answer_tokens=max_len))
    span = best_span(features, logits, list(range(windows)), context, spec)
    expected, score = loop_best_span(features, logits, range(windows), context, n_best, max_len)
    assert (span.text, span.start, span.end) == expected
    assert span.score == score


def test_qa_decoding_merges_windows_and_respects_the_answer_length() -> None:
    spec = TaskSpec("qa", "extractive_qa", [], FinetuneTaskConfig(n_best=5, max_answer_tokens=2))
    context = "alpha beta gamma delta"
    # two windows over the context; question tokens/specials have offset -1
    f1 = {"example_id": "q1", "offset_start": [-1, -1, 0, 6], "offset_end": [-1, -1, 5, 10]}
    f2 = {"example_id": "q1", "offset_start": [-1, -1, 11, 17], "offset_end": [-1, -1, 16, 22]}
    low = np.array([[9, 9], [0, 0], [1, 0], [0, 1]], dtype=float)  # best valid span "alpha beta" scores 2
    high = np.array([[9, 9], [0, 0], [3, 0], [0, 2]], dtype=float)  # "gamma delta" scores 5: wins across windows
    qa = REGISTRY["extractive_qa"]
    assert qa.decode([f1, f2], [low, high], [{"id": "q1", "context": context}], spec) == ["gamma delta"]
    # the CLS position (offset -1) never wins even with the highest logits
    long = {"example_id": "q2", "offset_start": [-1, 0, 6, 11], "offset_end": [-1, 5, 10, 16]}
    logits = np.array([[9, 9], [5, 0], [0, 0], [0, 5]], dtype=float)  # alpha..gamma is 3 tokens > max 2
    assert qa.decode([long], [logits], [{"id": "q2", "context": "alpha beta gamma"}], spec) in (
        ["alpha beta"],
        ["beta gamma"],
        ["alpha"],
        ["gamma"],
    )


def test_ner_decoding_uses_first_subtokens_and_marks_truncated_words_o() -> None:
    spec = SPECS[2]
    feature = {"word_ids": [-1, 0, 0, 1, -1]}  # word 2 was cut by truncation
    logits = np.zeros((5, 3))
    logits[1, 1] = logits[2, 0] = logits[3, 2] = (
        5  # word 0 -> B-X (first piece; the second piece says O), word 1 -> I-X
    )
    tags = REGISTRY["token_classification"].decode([feature], [logits], [{"tokens": ["w0", "w1", "w2"]}], spec)
    assert tags == [["B-X", "I-X", "O"]]


def test_head_mismatch_is_named() -> None:
    model = MultiTaskModel(tiny_encoder(), SPECS, dropout=0.1)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert head_shapes_problem(shapes, SPECS) is None
    grown = [TaskSpec("seq", "sequence_classification", ["a", "b", "c", "d"], FinetuneTaskConfig())] + SPECS[1:]
    assert "head for task 'seq' has 3 labels but the task now has 4" in head_shapes_problem(shapes, grown)


def test_every_registered_type_implements_the_whole_interface() -> None:
    from pipeline.tasks.base import TaskType

    for name, kind in REGISTRY.items():
        assert kind.name == name and kind.metrics and kind.fields and kind.columns and kind.request_fields
        for method in ("normalize", "checks", "encode", "score", "stats", "from_stats", "output_schema", "serve"):
            assert getattr(type(kind), method) is not getattr(TaskType, method), f"{name} does not implement {method}"
