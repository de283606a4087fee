"""Replay a traced step's allocations: the forward pass, backward node by node, the optimizer step.

Bytes live at every moment are the base (weights, optimizer state, batch, buffers) plus what the
replay holds: activations from their creation to their last use, or, when backward needs them,
until the last node keeping them has run; gradients from the node producing them to the node
consuming them; parameter gradients from then on. Gradient checkpointing keeps only each layer's
inputs in the forward pass and recomputes the layer just before its backward.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from lengthscan.memory.tape import Tape


@dataclass(frozen=True)
class Phase:
    """The highest point of one phase and what was live then, by term."""

    name: str
    peak: int
    terms: dict


class _Live:
    """Bytes live now, by term, and the highest point seen."""

    def __init__(self, base: dict, log: list | None = None):
        self.log = log  # every allocation (+bytes) and free (-bytes) with its term, for the allocator model
        self.terms = defaultdict(int, base)
        self.total = sum(base.values())
        self.best = Phase("", -1, {})
        self.phase = ""

    def add(self, kind: str, nbytes: int) -> None:
        if self.log is not None and nbytes:
            self.log.append((kind, nbytes))
        self.terms[kind] += nbytes
        self.total += nbytes
        if nbytes > 0 and self.total > self.best.peak:
            self.best = Phase(self.phase, self.total, {k: v for k, v in self.terms.items() if v})

    def spike(self, kind: str, nbytes: int) -> None:
        """Allocated and freed at once (an op's scratch): counts for the peak only."""
        self.add(kind, nbytes)
        self.add(kind, -nbytes)

    def start(self, phase: str) -> None:
        if self.log is not None:
            self.log.append((phase, 0))
        self.phase = phase
        self.best = Phase(phase, -1, {})


def replay(tape: Tape, base: dict, optimizer_temp: int, interlude: tuple | None = None,
           log: list | None = None, units=None) -> list[Phase]:
    """The peak of each phase (forward_end, backward, optimizer_step) of the traced step.

    ``interlude``: ``(phase, terms)``, bytes allocated and freed after the forward pass while its
    outputs and saved tensors are alive (DPO's reference forward): a phase of its own. ``log``: gets
    every allocation and free in order, ``(term, +bytes | -bytes)``, and ``(phase, 0)`` as each begins.
    ``units``: FSDP's per-layer gathers and reduces (``sharded.Sharding``), told as layers begin and end."""
    nodes, ckpt = tape.nodes, tape.checkpointed
    fwd_saved = {id(s) for s in tape.storages
                 if any(nodes[i].layer not in ckpt or nodes[i].outside for i in s.saved_by)}
    held = {id(s) for s in tape.storages if any(nodes[i].outside for i in s.saved_by)}
    for inputs in tape.layer_inputs.values():
        fwd_saved.update(id(x.storage) for x in inputs if x.storage is not None)
    live = _Live(base, log)
    alive: set[int] = set()
    frees: dict[int, list] = defaultdict(list)
    for s in tape.storages:
        if not s.held:
            frees[s.last_use].append(s)

    # forward
    live.start("forward_end")
    units = units or _NoUnits()
    units.begin(live)
    layer = None
    for index, (what, item) in enumerate(tape.events):
        here = item.layer if what == "alloc" else nodes[item].layer if what == "node" else layer
        if here != layer:
            if layer is not None:
                units.forward_leave(live, layer)
            if here is not None:
                units.forward_enter(live, here)
            layer = here
        if what == "alloc":
            if not item.held:
                alive.add(id(item))
                live.add(item.kind, item.nbytes)
        elif what == "ws":
            live.spike("workspace", item)
        for s in frees.get(index, ()):
            if id(s) in alive and id(s) not in fwd_saved:
                alive.discard(id(s))
                live.add(s.kind, -s.nbytes)
    if layer is not None:
        units.forward_leave(live, layer)
    units.forward_end(live)
    phases = [live.best]
    if interlude is not None:
        name, terms = interlude
        live.start(name)
        live.best = Phase(name, live.total, {k: v for k, v in live.terms.items() if v})
        for kind, nbytes in terms.items():
            live.add(kind, nbytes)
        phases.append(live.best)
        for kind, nbytes in terms.items():
            live.add(kind, -nbytes)
    # the outputs die, the autocast weight cache is cleared: only what backward keeps stays
    for s in tape.storages:
        if id(s) in alive and id(s) not in fwd_saved:
            alive.discard(id(s))
            live.add(s.kind, -s.nbytes)

    # backward
    live.start("backward")
    live.best = Phase("backward", live.total, dict(live.terms))
    refs = {id(s): len(s.saved_by) for s in tape.storages}
    for inputs in tape.layer_inputs.values():  # the checkpoint keeps its inputs until its backward
        for x in inputs:
            if x.storage is not None:
                refs[id(x.storage)] = refs.get(id(x.storage), 0) + 1
    current = None
    grads: dict[int, int] = {id(tape.loss): 4}
    accumulating = bool(base.get("gradients"))  # .grad exists from the start: new gradients are added in place
    param_grads: set[int] = set()
    viewed: set[int] = set()
    recomputed: set[int] = set()
    units.backward_begin(live)
    for index in range(len(nodes) - 1, -1, -1):
        node = nodes[index]
        if node.layer != current:
            if current in ckpt:
                _release(tape.layer_inputs[current], live, alive, refs)
            if current is not None:
                units.backward_leave(live, current)
            if node.layer is not None:
                units.backward_enter(live, node.layer)
            current = node.layer
        if node.layer is None:
            units.backward_node(live, node)
        if node.layer in ckpt and node.layer not in recomputed and node.saved:  # the first unpack recomputes
            recomputed.add(node.layer)
            _recompute(tape, node.layer, live, alive, refs, held)
        if not any(id(o) in grads for o in node.outputs):
            _release(node.saved, live, alive, refs)  # unreachable from the loss: freed with the graph
            continue
        transferred = False
        for x in node.inputs:
            size = 0 if node.alias else x.nbytes
            if x.param is not None and x.storage is not None and x.storage.held:
                size = 0 if node.alias else x.nbytes
                if id(x.param) in param_grads:  # tied weights: a second gradient is added to the first, out of
                    # place when the first is a linear's transposed view, in place otherwise (and ever after)
                    live.spike("gradients", 2 * size if id(x.param) in viewed else size)
                    viewed.discard(id(x.param))
                else:
                    param_grads.add(id(x.param))
                    if node.transposed:
                        viewed.add(id(x.param))
                    if accumulating:
                        live.spike("gradients", size)
                    else:
                        live.add("gradients", size)
            elif id(x) in grads:
                live.spike("activation_gradients", size)
            elif node.alias:
                grads[id(x)] = sum(grads.get(id(o), 0) for o in node.outputs)
                transferred = True
            else:
                grads[id(x)] = size
                live.add("activation_gradients", size)
        if node.workspace:
            live.spike("workspace", node.workspace)
        for o in node.outputs:
            size = grads.pop(id(o), 0)
            if not transferred:
                live.add("activation_gradients", -size)
        _release(node.saved, live, alive, refs)
    if current is not None:
        units.backward_leave(live, current)
    units.end(live)
    phases.append(live.best)

    # optimizer step: weights, gradients, state, and the implementation's temporaries
    live.start("optimizer_step")
    live.terms = defaultdict(int, {k: v for k, v in live.terms.items() if k in base or k == "gradients"})
    live.total = sum(live.terms.values())
    live.best = Phase("optimizer_step", live.total, {k: v for k, v in live.terms.items() if v})
    live.spike("optimizer_temporaries", optimizer_temp)
    phases.append(live.best)
    return phases


class _NoUnits:
    """One device: nothing gathered or reduced."""

    def begin(self, live):
        pass

    def forward_enter(self, live, layer):
        pass

    forward_leave = backward_leave = forward_enter

    backward_enter = backward_node = forward_enter

    end = forward_end = backward_begin = begin


def _release(tensors, live: _Live, alive: set, refs: dict) -> None:
    """Drop one reference to each tensor's storage; free those nobody keeps any more."""
    for x in tensors:
        s = x.storage
        if s is None or s.held:
            continue
        refs[id(s)] -= 1
        if refs[id(s)] <= 0 and id(s) in alive and not s.held:
            alive.discard(id(s))
            live.add(s.kind, -s.nbytes)


def _recompute(tape: Tape, layer: int, live: _Live, alive: set, refs: dict, held: set = frozenset()) -> None:
    """Run layer ``layer``'s forward again: what its backward needs stays, the rest is transient.

    A tensor the first forward pass left on a node's context (``held``: checkpointing never saw
    it) is allocated again, and lives until the recomputation's own graph is dropped."""
    mine = [s for s in tape.storages if s.layer == layer]
    ends = defaultdict(list)
    for s in mine:
        ends[s.last_use].append(s)
    last = max((s.created for s in mine), default=0)
    scratch = set(tape.layer_ws.get(layer, ()))
    again = 0
    # torch stops recomputing once every tensor saved through checkpointing's hooks is back: what comes after
    # (a tensor kept on a context past that point, the layer's output) is never allocated again
    saving = [i for i, (what, item) in enumerate(tape.events) if what == "node" and tape.nodes[item].layer == layer
              and not tape.nodes[item].outside and any(x.storage is not None and not x.storage.held
                                                       for x in tape.nodes[item].saved)]
    early = max(saving, default=last)
    for index, (what, item) in enumerate(tape.events):
        if what == "alloc" and item.layer == layer and id(item) in held:
            if index > early:
                continue
            again += item.nbytes
            live.add(item.kind, item.nbytes)
        elif what == "alloc" and item.layer == layer and id(item) not in alive:
            alive.add(id(item))
            live.add(item.kind, item.nbytes)
        elif what == "ws" and index in scratch:
            live.spike("workspace", item)
        for s in ends.get(index, ()):
            if id(s) in alive and refs[id(s)] == 0:
                alive.discard(id(s))
                live.add(s.kind, -s.nbytes)
        if index > min(last, early):  # torch's early stop (on by default)
            break
    for s in mine:  # the recomputed layer output and other leftovers nobody keeps
        if id(s) in alive and refs[id(s)] == 0:
            alive.discard(id(s))
            live.add(s.kind, -s.nbytes)
    if again:
        live.add("activations_other", -again)
