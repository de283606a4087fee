"""The measured CPU peak of one step of TRL's ``SFTTrainer``, ``DPOTrainer``, ``KTOTrainer`` and
``RewardTrainer`` (validation only).

torch, transformers, peft and trl are imported inside the functions: the package never needs them.
The trainer is TRL's own, built on CPU around a random-initialised Llama (no download) and a
word-level tokenizer made in memory; the batch is its own collator's, from pairs of the lengths
asked. The step is ``Trainer.training_step``'s: ``compute_loss`` under the precision's autocast,
``backward``, gradient clipping, the fused AdamW step, ``zero_grad``. A first step runs unmeasured
(the optimizer state then exists), the second is measured as :mod:`lengthscan.memory.cpu_peak`
measures the Trainer's (profiler allocation events on top of the bytes live before), with the CPU
kernels aligned with CUDA's (``align.cuda_like``, and ``align.fused_head_like`` for TRL's fused head).
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import asdict, dataclass

from lengthscan.memory.align import cuda_like, fused_head_like
from lengthscan.memory.cpu_peak import foreign_tensors, live_bytes, measure_step, profiled_peak


@dataclass(frozen=True)
class PairCase:
    """One measured step: the trainer, the model's sizes, the pairs' lengths and the run's options."""

    objective: str = "dpo"  # sft | dpo | kto | reward (sft, kto: rows of prompt + chosen, prompt + rejected in turn)
    vocab: int = 2000
    hidden: int = 64
    layers: int = 2
    batch: int = 2
    prompt: int = 40
    chosen: int = 60
    rejected: int = 30
    precision: str = "fp32"  # fp32 | bf16 (autocast)
    lora_r: int | None = None
    reference: str = "auto"  # auto | precomputed
    gradient_checkpointing: bool = False

    @property
    def length(self) -> int:
        """The padded length of the collated rows (prompt and the longer answer)."""
        return self.prompt + max(self.chosen, self.rejected)

    def config(self):
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=2 * self.hidden,
                           num_hidden_layers=self.layers, num_attention_heads=4, num_key_value_heads=2,
                           max_position_embeddings=4096, pad_token_id=2)

    def to_dict(self) -> dict:
        return asdict(self)


def predict(case: PairCase):
    """lengthscan's estimate of the case's step."""
    from lengthscan.memory.adapters import lora_from_flags
    from lengthscan.memory.api import estimate
    from lengthscan.memory.objective import Objective
    from lengthscan.memory.options import MemoryOptions, Shape

    adapter = lora_from_flags(case.lora_r, None, 2 * case.lora_r) if case.lora_r else None
    options = MemoryOptions(precision=case.precision, optimizer="adamw_torch_fused", adapter=adapter,
                            gradient_checkpointing=case.gradient_checkpointing,
                            objective=Objective(case.objective, case.reference))
    return estimate(case.config(), Shape(case.batch, case.length, padding=case.chosen != case.rejected), options)


def _tokenizer(vocab: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="w1", pad_token="w2", bos_token="w3")


def _trainer(case: PairCase):
    """TRL's trainer for the case, and one collated batch of its pairs."""
    import copy

    import torch
    from datasets import Dataset
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    torch.manual_seed(0)
    tok = _tokenizer(case.vocab)
    rows = Dataset.from_list([{"prompt": "w5 w6", "chosen": " w7", "rejected": " w8"}] * 4)
    options = dict(output_dir=tempfile.mkdtemp(), use_cpu=True, bf16=False, report_to="none",
                   per_device_train_batch_size=case.batch, gradient_checkpointing=False)
    peft = None
    if case.lora_r:
        from peft import LoraConfig

        peft = LoraConfig(r=case.lora_r, lora_alpha=2 * case.lora_r, target_modules="all-linear",
                          task_type="SEQ_CLS" if case.objective == "reward" else "CAUSAL_LM")
    g = torch.Generator().manual_seed(1)

    def ids(n):
        return torch.randint(4, case.vocab, (n,), generator=g).tolist()

    if case.objective == "sft":
        from trl import SFTConfig, SFTTrainer

        texts = Dataset.from_list([{"prompt": "w5 w6", "completion": " w7"}] * 4)
        trainer = SFTTrainer(model=LlamaForCausalLM(case.config()), train_dataset=texts, processing_class=tok,
                             args=SFTConfig(max_length=None, **options), peft_config=peft)
        examples = [{"input_ids": ids(case.prompt + (case.chosen if i % 2 == 0 else case.rejected))}
                    for i in range(case.batch)]
        return trainer, trainer.data_collator(examples)
    if case.objective == "kto":
        from trl import KTOConfig, KTOTrainer

        labelled = Dataset.from_list([{"prompt": "w5 w6", "completion": " w7", "label": k % 2 == 0} for k in range(4)])
        model = LlamaForCausalLM(case.config())
        trainer = KTOTrainer(model=model, ref_model=copy.deepcopy(model) if not case.lora_r else None,
                             train_dataset=labelled, processing_class=tok, peft_config=peft,
                             args=KTOConfig(max_length=None, train_sampling_strategy="sequential", **options))
        answers = [ids(case.chosen if i % 2 == 0 else case.rejected) for i in range(case.batch)]
        examples = [{"prompt_ids": ids(case.prompt), "completion_ids": answers[i],
                     "KL_completion_ids": answers[(i + 1) % case.batch], "label": i % 2 == 0}
                    for i in range(case.batch)]
        return trainer, trainer.data_collator(examples)
    if case.objective == "reward":
        from trl import RewardConfig, RewardTrainer

        config = case.config()
        config.num_labels = 1
        trainer = RewardTrainer(model=LlamaForSequenceClassification(config), train_dataset=rows,
                                args=RewardConfig(max_length=None, **options), processing_class=tok,
                                peft_config=peft)
        prompt = [ids(case.prompt) for _ in range(case.batch)]
        examples = [{"chosen_ids": p + ids(case.chosen), "rejected_ids": p + ids(case.rejected)} for p in prompt]
        return trainer, trainer.data_collator(examples)
    from trl import DPOConfig, DPOTrainer

    model = LlamaForCausalLM(case.config())
    precomputed = case.reference == "precomputed"  # the reference's figures computed once, before training
    reference = copy.deepcopy(model) if not case.lora_r and not precomputed else None
    trainer = DPOTrainer(model=model, ref_model=reference, train_dataset=rows, processing_class=tok, peft_config=peft,
                         args=DPOConfig(max_length=None, precompute_ref_log_probs=precomputed, **options))
    examples = [{"prompt_ids": ids(case.prompt), "chosen_ids": ids(case.chosen), "rejected_ids": ids(case.rejected)}
                for _ in range(case.batch)]
    batch = trainer.data_collator(examples)
    if precomputed:  # the batch carries the reference's figures, as the prepared dataset's rows do
        batch["ref_chosen_logps"] = torch.zeros(case.batch)
        batch["ref_rejected_logps"] = torch.zeros(case.batch)
    return trainer, batch


def measure(case: PairCase):
    """The measured peak of the case's steady-state step (a ``cpu_peak.Measurement``): the Trainer's
    step (``cpu_peak.measure_step``) with the trainer's own ``compute_loss``."""
    import torch

    from lengthscan.memory.options import MemoryOptions

    foreign = foreign_tensors(torch, torch.nn.Module())  # an earlier case's tensors, alive in this process
    trainer, batch = _trainer(case)
    model = trainer.model.train()
    if case.gradient_checkpointing:  # as Trainer.train() enables it: non-reentrant
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    options = MemoryOptions(precision=case.precision, optimizer="adamw_torch_fused")
    with fused_head_like() if case.objective != "reward" else contextlib.nullcontext():
        return measure_step(model, batch, options, loss=lambda: trainer.compute_loss(model, batch),
                            optimizer=trainer.optimizer, exclude=foreign)


@dataclass(frozen=True)
class GenerationCase:
    """GRPO's generation: ``rows`` prompts of ``prompt`` tokens (the first row half padding), each
    sampled to ``completion`` new tokens (no end token: every row runs to the maximum, the bound)."""

    rows: int = 8
    prompt: int = 64
    completion: int = 64
    vocab: int = 2000

    def config(self):
        return PairCase(vocab=self.vocab).config()

    def to_dict(self) -> dict:
        return asdict(self)


def predict_generation(case: GenerationCase) -> tuple[int, str]:
    """The bytes the generation phase adds above the training state, and its moment."""
    from lengthscan.memory.model import state_terms, trace
    from lengthscan.memory.objective import Objective
    from lengthscan.memory.options import MemoryOptions, Shape
    from lengthscan.memory.preference import generation_phase

    options = MemoryOptions(objective=Objective("grpo", completion_len=case.completion, generation_batch=case.rows))
    shape = Shape(case.rows, case.prompt + case.completion, padding=True)
    base = state_terms(trace(case.config(), shape, options), options)
    phase = generation_phase(case.config(), shape, options, base, "none")
    return phase.peak - sum(v for k, v in base.items() if k != "gradients"), phase.name


def measure_generation(case: GenerationCase) -> int:
    """The bytes ``generate`` allocates above what is live before it (weights, the prompts), with
    GRPOTrainer's sampling settings (temperature 1, no top-k, top-p 1), on CPU aligned with CUDA."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import GenerationConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(case.config()).eval()
    ids = torch.randint(4, case.vocab, (case.rows, case.prompt))
    mask = torch.ones(case.rows, case.prompt, dtype=torch.long)
    mask[0, :case.prompt // 2] = 0  # left padding, as GRPOTrainer pads its prompts
    config = GenerationConfig(max_new_tokens=case.completion, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                              pad_token_id=2, eos_token_id=None, disable_compile=True)
    foreign = foreign_tensors(torch, model)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with cuda_like(), torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
            before = live_bytes(torch, model, exclude=foreign)
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    finally:
        torch.set_num_threads(threads)
    return profiled_peak(prof, before).peak_bytes - before
