"""Value lifetimes as a state machine: create, combine, drop, collect, backward, save/restore,
access.

A model tracks which Values must be alive and what their data must be; after any sequence of
steps, a live handle reads the right data and a released one raises StaleValueError (never a
crash), and the process graph holds no more values than the live handles need.
"""

from __future__ import annotations

import gc
import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

import micrograd_c as mc
from micrograd_c import _core
from micrograd_c.engine import Value


class Tracked:
    """A handle and what the model expects of it."""

    def __init__(self, v: Value, data: float, depth: int, keeps: frozenset):
        self.v = v
        self.data = data
        self.depth = depth  # checkpoints open when it was made
        self.keeps = keeps  # ids of the nodes this handle keeps alive (itself and its operands')
        self.stale = False


class Lifetimes(RuleBasedStateMachine):
    """The bundle holds keys, not Values: hypothesis keeps what a bundle holds, and a dropped
    handle must really be gone for the graph's size to be checked exactly."""

    keys = Bundle("keys")

    def __init__(self) -> None:
        super().__init__()
        self.tokens: list = []
        self.objs: dict = {}
        self.next_key = 0
        gc.collect()
        self.base = mc.graph_len()

    def _track(self, v: Value, data: float, keeps: frozenset) -> int:
        key = self.next_key
        self.next_key += 1
        self.objs[key] = Tracked(v, data, len(self.tokens), keeps | {v._id})
        return key

    @rule(target=keys, x=st.floats(-4, 4, allow_nan=False))
    def create(self, x):
        return self._track(Value(x), x, frozenset())

    @rule(target=keys, ka=keys, kb=keys, op=st.sampled_from(["+", "-", "*", "max"]))
    def combine(self, ka, kb, op):
        a, b = self.objs.get(ka), self.objs.get(kb)
        if a is None or b is None:
            return self._track(Value(1.0), 1.0, frozenset())
        if a.stale or b.stale:
            with pytest.raises(mc.StaleValueError):
                _ = a.v + b.v
            return self._track(Value(0.0), 0.0, frozenset())
        v = {
            "+": lambda: a.v + b.v,
            "-": lambda: a.v - b.v,
            "*": lambda: a.v * b.v,
            "max": lambda: a.v.max(b.v),
        }[op]()
        data = {
            "+": a.data + b.data,
            "-": a.data - b.data,
            "*": a.data * b.data,
            "max": max(a.data, b.data),
        }[op]
        return self._track(v, data, a.keeps | b.keeps)

    @rule(k=consumes(keys))
    def drop(self, k):
        self.objs.pop(k, None)

    @rule()
    def collect(self):
        gc.collect()

    @rule(k=keys)
    def backward(self, k):
        a = self.objs.get(k)
        if a is None:
            return
        if a.stale:
            with pytest.raises(mc.StaleValueError):
                a.v.backward()
        else:
            a.v.backward()
            assert math.isfinite(a.v.grad)

    @rule()
    def save(self):
        self.tokens.append(_core.checkpoint_save())

    @precondition(lambda self: self.tokens)
    @rule()
    def restore(self):
        _core.checkpoint_restore(self.tokens.pop())
        for t in self.objs.values():
            if t.depth > len(self.tokens):
                t.stale = True

    @invariant()
    def handles_read_right_or_raise(self):
        for t in self.objs.values():
            assert t.v._alive is (not t.stale)
            if t.stale:
                with pytest.raises(mc.StaleValueError):
                    _ = t.v.data
                assert repr(t.v) == "Value(<released>)"
            else:
                assert t.v.data == t.data

    @invariant()
    def graph_holds_exactly_what_live_handles_reach(self):
        # no cycles: dropping a handle frees its nodes at once, without the cyclic collector
        reach = set()
        for t in self.objs.values():
            if not t.stale:
                reach |= t.keeps
        assert mc.graph_len() - self.base == len(reach)

    def teardown(self):
        while self.tokens:
            _core.checkpoint_restore(self.tokens.pop())
        self.objs.clear()
        assert mc.graph_len() == self.base


Lifetimes.TestCase.settings = settings(
    max_examples=40, stateful_step_count=30, deadline=None, derandomize=True, database=None
)
TestLifetimes = Lifetimes.TestCase
