"""bf16 weights in the training loop, fp32 master weights in the optimiser (Megatron-LM's bf16 mode).

Autocast keeps every weight in fp32 and casts it to bf16 at each use, and runs layer norms, softmax and the residual
additions in fp32, casting activations back and forth around them. On a CPU those casts and the fp32 element-wise work
are a large share of a small model's step (autocast's ``copy_`` alone was 16-18% of a MiniLM pretraining step on a
2-core AMX Xeon, docs/speed.md). Here the model itself is bf16 while it trains, so everything runs in bf16 (the CPU
kernels of layer norm and softmax accumulate in fp32); the optimiser holds an fp32 master copy of every weight, takes
the step's bf16 gradients into fp32 and updates the masters (fused AdamW, the same update as before), then writes
them back rounded to bf16. Losses stay fp32 (the models compute them from fp32 logits).

Outside ``Trainer.train`` the model is fp32 as before: :class:`MasterWeightsTrainer` turns it to bf16 when the
Trainer builds its optimiser (so a resumed run's masters are the fp32 weights its checkpoint saved), saves the fp32
masters into every checkpoint, and hands the masters back to the model when training ends, whatever ends it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import Trainer


class MasterWeights:
    """A model's parameters turned bf16, with the fp32 master copy of each (tied weights once)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.params = list(model.parameters())  # unique: a tied weight is one parameter
        if any(p.dtype != torch.float32 for p in self.params):
            raise ValueError("master weights start from an fp32 model")
        self.masters = [p.detach() for p in self.params]  # the fp32 tensors themselves: the model gets new bf16 ones
        self.of = {id(p): m for p, m in zip(self.params, self.masters, strict=True)}
        self._fp32_depth = 0
        self.publish()

    def publish(self) -> None:
        """The model's weights := its masters rounded to bf16."""
        for p, m in zip(self.params, self.masters, strict=True):
            p.data = m.to(torch.bfloat16)

    def take_grads(self) -> None:
        """The masters' gradients := the model's bf16 gradients in fp32 (the model's are dropped)."""
        for p, m in zip(self.params, self.masters, strict=True):
            m.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @contextlib.contextmanager
    def fp32_in_model(self) -> Iterator[None]:
        """Inside the block the model holds its fp32 masters (to save them); after it, their bf16 copies."""
        self._fp32_depth += 1
        if self._fp32_depth == 1:
            for p, m in zip(self.params, self.masters, strict=True):
                p.data = m
        try:
            yield
        finally:
            self._fp32_depth -= 1
            if self._fp32_depth == 0:
                self.publish()

    def release(self) -> None:
        """The model keeps its fp32 masters as its weights, for good."""
        for p, m in zip(self.params, self.masters, strict=True):
            p.data = m
            m.grad = None


class MasterAdamW(torch.optim.AdamW):
    """AdamW over the fp32 masters of :class:`MasterWeights`: each step takes the model's bf16 gradients, updates
    the masters and writes them back to the model in bf16. Its state (and ``state_dict``) is AdamW's over the masters."""

    def __init__(self, optimizer: torch.optim.AdamW, weights: MasterWeights) -> None:
        groups = [{**g, "params": [weights.of[id(p)] for p in g["params"]]} for g in optimizer.param_groups]
        defaults = {k: v for k, v in optimizer.defaults.items() if k != "decoupled_weight_decay"}  # AdamW sets it
        super().__init__(groups, **defaults)
        self.weights = weights

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        self.weights.take_grads()
        loss = super().step(closure)
        self.zero_grad(set_to_none=True)
        self.weights.publish()
        return loss


class MasterWeightsTrainer(Trainer):
    """An HF Trainer that, where ``bf16_weights`` is set, trains the model in bf16 with fp32 master weights
    (:class:`MasterWeights`, :class:`MasterAdamW`); the Trainer's own autocast is then off (``args.bf16`` false).
    Its optimiser must be torch's AdamW (the stages use the fused one)."""

    bf16_weights: bool = False
    master_weights: MasterWeights | None = None

    def create_optimizer(self, model: Any = None) -> Any:
        optimizer = super().create_optimizer(model)
        if self.bf16_weights and self.master_weights is None:
            if type(optimizer) is not torch.optim.AdamW:
                raise TypeError(f"bf16 weights with fp32 masters need torch.optim.AdamW, not {type(optimizer)}")
            self.master_weights = MasterWeights(self.model)  # after a resumed run loaded its checkpoint's fp32 weights
            self.optimizer = MasterAdamW(optimizer, self.master_weights)
        return self.optimizer

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)
        finally:  # the model leaves training with the fp32 weights it trained, also when training failed
            if self.master_weights is not None:
                self.master_weights.release()
                self.master_weights = None

    def fp32_weights(self) -> Any:
        """A block in which the model holds fp32 weights (its masters while it trains in bf16)."""
        return contextlib.nullcontext() if self.master_weights is None else self.master_weights.fp32_in_model()

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        with self.fp32_weights():  # a checkpoint holds the fp32 masters: resuming from it is exact
            super()._save(output_dir, state_dict=state_dict)
