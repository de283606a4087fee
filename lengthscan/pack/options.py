"""``--packing`` and its options, apart from the simulation (which needs numba): an audit without
packing never imports it."""

from __future__ import annotations

from dataclasses import dataclass

from lengthscan.optionfield import option

#: TRL's strategies (``SFTConfig.packing_strategy``; ``pack.trl`` simulates them)
TRL_STRATEGIES = ("bfd", "bfd_split", "wrapped")
#: every strategy ``--packing`` takes: TRL's three, axolotl's multipack, LLaMA-Factory's knapsack
STRATEGIES = (*TRL_STRATEGIES, "multipack", "knapsack")


AUDIT = ("audit",)
#: on the command line these default to None, so that one given without --packing is refused
_GIVEN = {"audit": {"default": None}}


class PackingError(ValueError):
    """Packing cannot be simulated as asked (exit code 2)."""


@dataclass(frozen=True)
class PackingOptions:
    """``--packing STRATEGY --max-length L``; TRL's ``dataset_num_proc`` and ``shuffle_dataset``
    (with ``args.seed``), and the batch, accumulation and devices that turn packs into steps."""

    packing: str | None = option(None, "--packing", "simulate the packing of every row: TRL's bfd, bfd_split or "
                                 "wrapped, axolotl's multipack, LLaMA-Factory's knapsack: packs.parquet, efficiency, "
                                 "tokens lost, steps", commands=AUDIT, choices=STRATEGIES)
    max_length: int | None = option(None, "--max-length", "with --packing: the packed row's tokens "
                                    "(SFTConfig.max_length)", commands=AUDIT, type=int, metavar="L")
    packing_num_proc: int | None = option(None, "--packing-num-proc", "with --packing: TRL's dataset_num_proc (it "
                                          "changes the packs; default none)", commands=AUDIT, type=int, metavar="N")
    shuffle_seed: int | None = option(None, "--shuffle-seed", "with --packing: TRL's shuffle_dataset with args.seed "
                                      "SEED (default: not shuffled); multipack: the seed of axolotl's sampler "
                                      "order (default 42)", commands=AUDIT, type=int, metavar="SEED")
    batch_size: int = option(8, "--batch-size", "with --packing: per-device batch size, for steps per epoch "
                             "(default 8)", commands=AUDIT, type=int, metavar="B", overrides=_GIVEN)
    grad_accum: int = option(1, "--grad-accum", "with --packing: gradient accumulation steps (default 1)",
                             commands=AUDIT, type=int, metavar="K", overrides=_GIVEN)
    devices: int = option(1, "--devices", "with --packing: data-parallel devices (default 1)", commands=AUDIT,
                          type=int, metavar="N", overrides=_GIVEN)

    def check(self) -> None:
        if self.packing is None:
            stray = [flag for flag, value in (("--max-length", self.max_length),
                                              ("--packing-num-proc", self.packing_num_proc),
                                              ("--shuffle-seed", self.shuffle_seed)) if value is not None]
            if stray:
                raise PackingError(f"{', '.join(stray)}: packing's options; add --packing STRATEGY "
                                   f"({', '.join(STRATEGIES)})")
            return
        if self.packing not in STRATEGIES:
            raise PackingError(f"--packing {self.packing}: not a strategy; choose {', '.join(STRATEGIES)}")
        if self.max_length is None:
            raise PackingError(f"--packing {self.packing} needs --max-length L (the packed row's tokens)")
        bounds = (("--max-length", self.max_length, 1 << 24), ("--packing-num-proc", self.packing_num_proc, 512),
                  ("--batch-size", self.batch_size, 1 << 20), ("--grad-accum", self.grad_accum, 1 << 20),
                  ("--devices", self.devices, 1 << 20))
        for name, value, most in bounds:
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most):
                raise PackingError(f"{name} {value}: give a whole number between 1 and {most:,}")
        seed = self.shuffle_seed
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
            raise PackingError(f"--shuffle-seed {seed}: give a whole number of at least 0 (TRL's args.seed)")
