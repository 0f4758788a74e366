"""vLLM v1 continuous batching in virtual time: DP engines in lock-step, each with its own KV blocks.

Nothing here sleeps or reads a clock. The caller asks the :class:`Node` to :meth:`~Node.plan` a step
at a virtual time (that schedules every engine's batch and prices the step with
:func:`~tuner.perfmodel.step.step_time`), waits until the step's end however it likes
(the server sleeps for it, the predictor does not), then :meth:`~Node.apply` s it (tokens come out,
requests finish). The rules are vLLM's (``vllm/v1/core/sched/scheduler.py``):

- Running requests go first, in admission order. A prefill continues in chunks of what is left of
  ``max-num-batched-tokens`` (chunked prefill); a decode takes ``1 + k`` tokens (k drafts).
- A running request that cannot get a block preempts the most recently admitted one (its blocks are
  freed, it goes back to the head of the queue and later recomputes prompt + output so far).
- Waiting requests are admitted in arrival order only in a step with no preemption, while
  ``max-num-seqs`` and the token budget allow and their first chunk's blocks are free; the prefix
  cache supplies the leading blocks it already holds.
- The first output token is sampled when a request's prefill completes; with speculation a decode
  step emits ``1 + a`` tokens, ``a`` accepted drafts out of ``k`` (each accepted with probability α).

A :class:`Group` is one stream standing for ``multiplicity`` identical virtual requests. They count
``multiplicity`` times in the batch, the KV blocks (except a shared prefix hit, held once) and every
metric. Resource decisions stay per request: a group that only partly fits is admitted in part, and
a preemption takes only the copies the shortfall needs; the part that leaves becomes a group of its
own (same state, distinct content beyond the shared prefix), and the client's stream follows one
copy, drawn in proportion to the copies. So results hardly depend on the multiplicity.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tuner.engines.emulated.kv_pool import KvPool
from tuner.perfmodel.architecture import ATTENTION_CONTEXT_CAP_TOKENS
from tuner.perfmodel.step import EngineBatch, NodeModel, StepTime, step_time

__all__ = ["Engine", "Group", "Node", "Observer", "Step", "TokenSink"]

WAITING, RUNNING, DONE = 0, 1, 2


class TokenSink(Protocol):
    """Where a group's tokens go (a stream of the server, or the predictor's client)."""

    def emit(self, group: Group, tokens: int, t_v: float, finished: bool) -> None: ...


class Observer(Protocol):
    """Where the engines' counters, histograms and gauges go (names are vLLM's metric names)."""

    def count(self, engine: int, name: str, amount: float, labels: tuple[tuple[str, str], ...] = ()) -> None: ...

    def observe(self, engine: int, name: str, value: float, weight: int) -> None: ...

    def gauge(self, engine: int, name: str, value: float) -> None: ...


class Group:
    """One stream: ``multiplicity`` identical virtual requests (see the module docstring)."""

    __slots__ = ("_chain", "arrival_v", "computed", "engine", "family", "finish_reason", "first_scheduled_v",
                 "first_token_v", "generated", "hashed", "last_token_v", "max_output", "multiplicity",
                 "own_blocks", "preemptions", "prompt_len", "published_upto", "remote_tokens", "shared_blocks",
                 "sink", "state", "target", "token_ids", "uid")

    def __init__(self, uid: int, multiplicity: int, prompt_len: int, max_output: int, arrival_v: float,
                 *, prompt_hashes: Sequence[int] = (), token_ids: Sequence[int] | None = None,
                 sink: TokenSink | None = None, finish_reason: str = "length") -> None:
        if multiplicity < 1 or prompt_len < 1 or max_output < 1:
            raise ValueError(f"group {uid}: multiplicity {multiplicity}, prompt {prompt_len}, output {max_output}")
        self.uid = uid
        self.multiplicity = multiplicity
        self.prompt_len = prompt_len
        self.max_output = max_output
        self.arrival_v = arrival_v
        self._chain = list(prompt_hashes)
        self.token_ids = token_ids
        self.sink = sink
        self.finish_reason = finish_reason
        self.state = WAITING
        self.engine = -1
        self.computed = 0
        self.generated = 0
        self.target = prompt_len
        self.own_blocks = 0
        self.shared_blocks = 0
        self.hashed: list[int] = []
        self.published_upto = 0
        self.preemptions = 0
        self.first_scheduled_v: float | None = None
        self.first_token_v: float | None = None
        self.last_token_v: float | None = None
        self.family: list[Group] = [self]
        """This group and the groups split off it: one client stream, aborted together."""
        self.remote_tokens = 0
        """Prompt tokens whose KV a KV connector delivers at admission (a decode member of a prefill/decode
        layout: ``tuner.engines.emulated.disagg``); a preempted request computes them itself."""

    @property
    def done(self) -> bool:
        return self.state == DONE

    def hash_at(self, index: int, block_size: int) -> int:
        """The chained hash of block ``index`` of this request's tokens (prompt, then output).

        From the token ids when the group has them (the server does), the way
        :func:`~tuner.engines.emulated.kv_pool.chain_hashes` computes them; otherwise given hashes
        (``prompt_hashes``, e.g. a shared prefix) and then content unique to this request.

        That content is keyed by the uid's sign and magnitude, not the bare uid: CPython hashes an int
        as itself except ``hash(-1) == hash(-2)`` (``-1`` is its error value), so the first two
        split-off groups (uids ``-1`` and ``-2``) had one chain, and the second read the first's blocks
        as prefix-cache hits on prompts that share nothing (issue 27's refused windows).
        """
        chain = self._chain
        while len(chain) <= index:
            i = len(chain)
            parent = chain[-1] if chain else 0
            ids = self.token_ids
            if ids is not None and (i + 1) * block_size <= len(ids):
                chain.append(hash((parent, i, tuple(ids[i * block_size:(i + 1) * block_size]))))
            else:
                chain.append(hash((parent, self.uid < 0, abs(self.uid), i)))
        return chain[index]


_Item = tuple["Group", int, bool]
"""(group, tokens it runs this step, whether they are prefill tokens)."""


@dataclass(frozen=True)
class Step:
    """A planned lock-step: when it starts and ends, and what each engine runs."""

    start_v: float
    end_v: float
    time: StepTime
    batches: tuple[EngineBatch, ...]
    items: tuple[tuple[_Item, ...], ...]
    batched_tokens: tuple[int, ...]
    """Tokens each engine runs (decodes × (1 + k) + prefill), in virtual requests."""


@dataclass
class Engine:
    """One DP engine: its queue, its running batch and its KV pool."""

    index: int
    pool: KvPool
    max_num_seqs: int
    max_batched_tokens: int
    chunked_prefill: bool
    query_tokens: int
    waiting: deque[Group] = field(default_factory=deque)
    running: list[Group] = field(default_factory=list)
    running_reqs: int = 0
    waiting_reqs: int = 0

    @property
    def load(self) -> int:
        """vLLM's DP balancing score: waiting × 4 + running."""
        return self.waiting_reqs * 4 + self.running_reqs


class Node:
    """All DP engines of one launch and the lock-step between them."""

    def __init__(self, model: NodeModel, num_blocks: int, observer: Observer, *, seed: int = 0) -> None:
        cfg = model.config
        self.model = model
        self.observer = observer
        self.block_size = cfg.block_size
        self.acceptance = model.coefficients.acceptance(cfg.spec_method) if cfg.speculative else 0.0
        self.spec_tokens = cfg.spec_tokens if cfg.speculative else 0
        self.rng = random.Random(seed)
        self.engines = [Engine(index=i, pool=KvPool(num_blocks, cfg.block_size, caching=cfg.enable_prefix_caching),
                               max_num_seqs=cfg.max_num_seqs, max_batched_tokens=cfg.max_num_batched_tokens,
                               chunked_prefill=cfg.enable_chunked_prefill, query_tokens=1 + self.spec_tokens)
                        for i in range(cfg.dp)]
        self.now_v = 0.0
        self.steps = 0
        self._uid = 0  # split-off groups count down from here, clients' uids count up from 0

    # -- admission ---------------------------------------------------------------------------------
    def submit(self, group: Group) -> Engine:
        """Queue a group on the least loaded engine (vLLM's DP coordinator)."""
        engine = min(self.engines, key=lambda e: (e.load, e.index))
        group.engine = engine.index
        group.state = WAITING
        engine.waiting.append(group)
        engine.waiting_reqs += group.multiplicity
        return engine

    def abort(self, group: Group) -> None:
        """A client went away: its groups leave the queue or the batch and free their blocks."""
        for member in list(group.family):
            if member.state == DONE or member.engine < 0:
                continue
            engine = self.engines[member.engine]
            if member.state == WAITING:
                engine.waiting.remove(member)
                engine.waiting_reqs -= member.multiplicity
            else:
                self._free(engine, member)
                engine.running.remove(member)
                engine.running_reqs -= member.multiplicity
            member.state = DONE
            self.observer.count(engine.index, "vllm:request_success", member.multiplicity,
                                (("finished_reason", "abort"),))

    @property
    def busy(self) -> bool:
        return any(e.running or e.waiting for e in self.engines)

    def next_arrival_v(self) -> float | None:
        """The earliest arrival among queued groups (``None`` when every queue is empty)."""
        times = [g.arrival_v for e in self.engines for g in e.waiting]
        return min(times) if times else None

    # -- one step ----------------------------------------------------------------------------------
    def plan(self, start_v: float) -> Step | None:
        """Schedule every engine's batch for a step starting at ``start_v`` (None: nothing can run)."""
        batches: list[EngineBatch] = []
        items: list[tuple[_Item, ...]] = []
        for engine in self.engines:
            batch, chosen = self._schedule(engine, start_v)
            batches.append(batch)
            items.append(tuple(chosen))
        if all(b.empty for b in batches):
            return None
        timing = step_time(self.model, batches)
        q = 1 + self.spec_tokens
        return Step(start_v=start_v, end_v=start_v + timing.total_s, time=timing, batches=tuple(batches),
                    items=tuple(items), batched_tokens=tuple(b.decode_seqs * q + b.prefill_tokens for b in batches))

    def apply(self, step: Step) -> None:
        """The step is over: emit its tokens, finish what is finished, publish the gauges."""
        self.now_v = step.end_v
        self.steps += 1
        for engine, chosen, tokens in zip(self.engines, step.items, step.batched_tokens, strict=True):
            self._advance_all(engine, chosen, step.end_v)
            if tokens:
                self.observer.observe(engine.index, "vllm:iteration_tokens_total", tokens, 1)
            self.publish_gauges(engine)

    def publish_gauges(self, engine: Engine) -> None:
        self.observer.gauge(engine.index, "vllm:num_requests_running", engine.running_reqs)
        self.observer.gauge(engine.index, "vllm:num_requests_waiting", engine.waiting_reqs)
        self.observer.gauge(engine.index, "vllm:kv_cache_usage_perc", engine.pool.usage)

    # -- internals ---------------------------------------------------------------------------------
    def _schedule(self, engine: Engine, now_v: float) -> tuple[EngineBatch, list[_Item]]:
        budget = engine.max_batched_tokens
        chosen: list[_Item] = []
        preempted = False
        q = engine.query_tokens
        bs = self.block_size
        pool = engine.pool
        running = engine.running
        i = 0
        while i < len(running):
            g = running[i]
            m = g.multiplicity
            prefill = g.computed < g.target
            if prefill:
                new = min(g.target - g.computed, budget // m)
                if new <= 0:
                    i += 1
                    continue
            else:
                new = q
                if new * m > budget:
                    i += 1
                    continue
            need = -(-(g.computed + new) // bs) - g.shared_blocks - g.own_blocks
            if need > 0:
                if pool.free < need * m:
                    preempted = True
                    self._make_room(engine, g, need)
                    if g.state != RUNNING:
                        break
                    m = g.multiplicity
                pool.allocate(need * m)
                g.own_blocks += need
            budget -= new * m
            chosen.append((g, new, prefill))
            i += 1
        if not preempted:
            self._admit(engine, now_v, budget, chosen)
        return self._batch(chosen), chosen

    def _make_room(self, engine: Engine, g: Group, need: int) -> None:
        """Preempt from the tail, request by request, until ``need`` blocks per copy of ``g`` fit.

        A group at the tail gives up only as many copies as the shortfall needs (it splits); when
        ``g`` itself is reached, it keeps the copies that fit, or goes back to the queue whole.
        """
        pool = engine.pool
        running = engine.running
        while pool.free < need * g.multiplicity:
            victim = running[-1]
            if victim is g:
                m = g.multiplicity
                keep = min(m - 1, (pool.free + m * g.own_blocks) // (need + g.own_blocks))
                if keep >= 1:
                    self._preempt(engine, self._split(engine, g, m - keep), listed=False)
                else:
                    self._preempt(engine, g)
                return
            shortfall = need * g.multiplicity - pool.free
            copies = -(-shortfall // max(1, victim.own_blocks))
            if copies < victim.multiplicity:
                self._preempt(engine, self._split(engine, victim, copies), listed=False)
            else:
                self._preempt(engine, victim)

    def _admit(self, engine: Engine, now_v: float, budget: int, chosen: list[_Item]) -> None:
        """Admit waiting requests in arrival order while seats, token budget and blocks allow.

        A group is admitted in part when only some of its copies fit (the rest wait at the head
        of the queue): by seats and by free blocks. Its copies share the token budget (each takes an
        equal chunk of its prompt; vLLM would give whole prompts to the first requests and the rest to
        the next step, which moves the mean TTFT by under a step); without chunked prefill only the
        copies whose whole prompt fits are admitted.
        """
        pool = engine.pool
        bs = self.block_size
        while engine.waiting and budget > 0:
            g = engine.waiting[0]
            m = g.multiplicity
            seats = engine.max_num_seqs - engine.running_reqs
            if g.arrival_v > now_v or seats <= 0:
                break
            hashes = self._hashes(g, (g.target - 1) // bs)
            hits = pool.lookup(hashes)
            hit_tokens = hits * bs
            remote = max(0, g.remote_tokens - hit_tokens)  # delivered by the KV connector beyond the local hits
            hit_tokens += remote
            remaining = g.target - hit_tokens
            if engine.chunked_prefill:
                by_budget = min(m, budget)
                chunk = min(remaining, budget // by_budget)
            elif budget >= remaining:
                by_budget, chunk = budget // remaining, remaining
            else:
                break
            need = -(-(hit_tokens + chunk) // bs) - hits
            free = pool.free - pool.evictable_among(hashes[:hits])
            by_blocks = free // need if need > 0 else m
            admit = min(m, seats, by_budget, by_blocks)
            if admit <= 0:
                break
            engine.waiting.popleft()
            if admit < m:
                rest = self._split(engine, g, m - admit, prefix_blocks=hits)
                engine.waiting.appendleft(rest)
                m = admit
            pool.acquire(hashes[:hits])
            pool.allocate(need * m)
            engine.waiting_reqs -= m
            engine.running.append(g)
            engine.running_reqs += m
            g.state = RUNNING
            g.shared_blocks = hits
            g.own_blocks = need
            g.hashed = list(hashes[:hits])
            g.published_upto = hits
            g.computed = hit_tokens
            self.observer.count(engine.index, "vllm:prefix_cache_queries", m * g.target)
            self.observer.count(engine.index, "vllm:prefix_cache_hits", m * (hit_tokens - remote))
            if g.remote_tokens:
                self.observer.count(engine.index, "vllm:external_prefix_cache_queries", m * g.target)
                self.observer.count(engine.index, "vllm:external_prefix_cache_hits", m * remote)
                g.remote_tokens = 0
            if g.first_scheduled_v is None:
                g.first_scheduled_v = now_v
                self.observer.observe(engine.index, "vllm:request_queue_time_seconds", now_v - g.arrival_v, m)
            budget -= chunk * m
            chosen.append((g, chunk, True))

    def _split(self, engine: Engine, g: Group, copies: int, *, prefix_blocks: int | None = None) -> Group:
        """Detach ``copies`` of ``g`` as a new group in the same state (not yet in any list).

        The new group holds its own blocks (anonymous: the blocks ``g`` published stay with ``g``'s
        first copy) and a reference on the shared prefix hit. Its content beyond that prefix is its
        own (distinct requests), so it can never hit ``g``'s blocks. Which part the client's stream
        follows is drawn in proportion to the copies, so streams sample the requests without bias.
        """
        shared = g.shared_blocks if prefix_blocks is None else prefix_blocks
        ghost = Group(self._next_uid(), copies, g.prompt_len, g.max_output, g.arrival_v,
                      prompt_hashes=[g.hash_at(i, self.block_size) for i in range(shared)],
                      finish_reason=g.finish_reason)
        for name in ("state", "engine", "computed", "generated", "target", "own_blocks", "shared_blocks",
                     "remote_tokens", "preemptions", "first_scheduled_v", "first_token_v", "last_token_v"):
            setattr(ghost, name, getattr(g, name))
        ghost.hashed = list(g.hashed[:g.shared_blocks])
        ghost.published_upto = g.shared_blocks
        if ghost.hashed:
            engine.pool.acquire(ghost.hashed)
        ghost.family = g.family
        g.family.append(ghost)
        g.multiplicity -= copies
        if g.sink is not None and self.rng.random() < copies / (copies + g.multiplicity):
            ghost.sink, g.sink = g.sink, None
        return ghost

    def _next_uid(self) -> int:
        self._uid -= 1
        return self._uid

    def _hashes(self, g: Group, blocks: int) -> list[int]:
        return [g.hash_at(i, self.block_size) for i in range(blocks)]

    def _batch(self, chosen: Sequence[_Item]) -> EngineBatch:
        dec_seqs = dec_ctx = dec_att = pre_seqs = pre_tokens = pre_ctx = 0
        pre_pairs = 0.0
        cap = ATTENTION_CONTEXT_CAP_TOKENS
        for g, tokens, prefill in chosen:
            m = g.multiplicity
            computed = g.computed
            if prefill:
                pre_seqs += m
                pre_tokens += tokens * m
                pre_ctx += computed * m
                pre_pairs += tokens * min(computed + tokens / 2.0, cap) * m
            else:
                dec_seqs += m
                dec_ctx += computed * m
                dec_att += (computed if computed < cap else cap) * m
        return EngineBatch(decode_seqs=dec_seqs, decode_context_tokens=dec_ctx, decode_attended_tokens=dec_att,
                           prefill_seqs=pre_seqs, prefill_tokens=pre_tokens, prefill_context_tokens=pre_ctx,
                           prefill_attended_pairs=pre_pairs)

    def _advance_all(self, engine: Engine, chosen: Sequence[_Item], t_v: float) -> None:
        """Apply one engine's part of a finished step (the hot loop: plain arithmetic per group)."""
        k = self.spec_tokens
        alpha = self.acceptance
        rand = self.rng.random
        bs = self.block_size
        caching = engine.pool.caching
        obs = self.observer
        idx = engine.index
        generated = 0
        for g, tokens, prefill in chosen:
            if g.state != RUNNING:
                continue
            m = g.multiplicity
            if prefill:
                g.computed += tokens
                if g.computed < g.target:
                    if caching:
                        self._publish(engine, g)
                    continue
                emitted = 1
            else:
                accepted = 0
                if k:
                    while accepted < k and rand() < alpha:
                        accepted += 1
                    self._count_spec(idx, m, accepted)
                emitted = 1 + accepted
                left = g.max_output - g.generated
                if emitted > left:
                    emitted = left
                g.computed += emitted
            if caching and g.computed // bs > g.published_upto:
                self._publish(engine, g)
            if g.first_token_v is None:
                g.first_token_v = t_v
                obs.observe(idx, "vllm:time_to_first_token_seconds", t_v - g.arrival_v, m)
                obs.count(idx, "vllm:prompt_tokens", m * g.prompt_len)
            elif g.last_token_v is not None:
                obs.observe(idx, "vllm:inter_token_latency_seconds", t_v - g.last_token_v, m)
            g.last_token_v = t_v
            g.generated += emitted
            generated += m * emitted
            finished = g.generated >= g.max_output
            if finished:
                self._finish(engine, g, t_v)
            if g.sink is not None:
                g.sink.emit(g, emitted, t_v, finished)
        if generated:
            obs.count(idx, "vllm:generation_tokens", generated)

    def _count_spec(self, engine: int, m: int, accepted: int) -> None:
        obs = self.observer
        obs.count(engine, "vllm:spec_decode_num_drafts", m)
        obs.count(engine, "vllm:spec_decode_num_draft_tokens", m * self.spec_tokens)
        obs.count(engine, "vllm:spec_decode_num_accepted_tokens", m * accepted)
        for pos in range(accepted):
            obs.count(engine, "vllm:spec_decode_num_accepted_tokens_per_pos", m, (("position", str(pos)),))

    def _publish(self, engine: Engine, g: Group) -> None:
        if not engine.pool.caching:
            return
        full = g.computed // self.block_size
        for i in range(g.published_upto, full):
            h = g.hash_at(i, self.block_size)
            if engine.pool.publish(h):
                g.hashed.append(h)
        g.published_upto = max(g.published_upto, full)

    def _finish(self, engine: Engine, g: Group, t_v: float) -> None:
        m = g.multiplicity
        idx = engine.index
        self._free(engine, g)
        engine.running.remove(g)
        engine.running_reqs -= m
        g.state = DONE
        obs = self.observer
        first_token = g.first_token_v if g.first_token_v is not None else t_v
        scheduled = g.first_scheduled_v if g.first_scheduled_v is not None else g.arrival_v
        obs.count(idx, "vllm:request_success", m, (("finished_reason", g.finish_reason),))
        obs.observe(idx, "vllm:e2e_request_latency_seconds", t_v - g.arrival_v, m)
        obs.observe(idx, "vllm:request_inference_time_seconds", t_v - scheduled, m)
        obs.observe(idx, "vllm:request_prefill_time_seconds", first_token - scheduled, m)
        obs.observe(idx, "vllm:request_decode_time_seconds", t_v - first_token, m)
        if g.generated > 1:
            obs.observe(idx, "vllm:request_time_per_output_token_seconds",
                        (t_v - first_token) / (g.generated - 1), m)
        obs.observe(idx, "vllm:request_prompt_tokens", g.prompt_len, m)
        obs.observe(idx, "vllm:request_generation_tokens", g.generated, m)
        obs.observe(idx, "vllm:request_params_max_tokens", g.max_output, m)
        obs.observe(idx, "vllm:request_num_preemptions", g.preemptions, m)

    def _free(self, engine: Engine, g: Group) -> None:
        own_hashed = len(g.hashed) - g.shared_blocks
        anonymous = g.multiplicity * g.own_blocks - own_hashed
        engine.pool.release(anonymous, g.hashed)
        g.hashed = []
        g.own_blocks = 0
        g.shared_blocks = 0

    def _preempt(self, engine: Engine, g: Group, *, listed: bool = True) -> None:
        """Back to the head of the queue; it will recompute prompt + output so far (vLLM's recompute)."""
        self._free(engine, g)
        if listed:
            engine.running.remove(g)
        engine.running_reqs -= g.multiplicity
        g.state = WAITING
        g.computed = 0
        g.published_upto = 0
        g.target = g.prompt_len + g.generated
        g.preemptions += 1
        engine.waiting.appendleft(g)
        engine.waiting_reqs += g.multiplicity
        self.observer.count(engine.index, "vllm:num_preemptions", g.multiplicity)
