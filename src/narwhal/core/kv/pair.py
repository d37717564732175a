"""Pair checks: will consumer D complete a NIXL handshake with producer P and read its blocks?

vLLM checks the compatibility hash first and then, at the first request, a list of runtime rules
(reference §2.5). Both are predicted here from two geometries so a mismatch is a named finding
before serving, not a failed request under load. In pull mode D initiates: D is "local", P is
"remote". Every finding names both engines, the factor and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from narwhal.core.document_io import StrictModel
from narwhal.core.kv.compat_hash import FIX_BY_FACTOR, differing_factors
from narwhal.core.kv.geometry import Geometry
from narwhal.core.kv.layout import BLOCK_CONTIGUOUS
from narwhal.core.kv.versions import facts_for


class Finding(StrictModel):
    """One reason the pair fails, in operator terms."""

    check: str
    producer: str
    consumer: str
    factor: str
    producer_value: Any
    consumer_value: Any
    message: str
    fix: str


class PairReport(StrictModel):
    """The verdict for one ordered producer -> consumer pair."""

    producer: str
    consumer: str
    hash_equal: bool
    tp_ratio: int | None
    findings: list[Finding]

    @property
    def compatible(self) -> bool:
        return not self.findings


def tp_ratio(local_tp: int, remote_tp: int) -> int | None:
    """TransferTopology ratio: positive when D is wider, negative when P is, None if invalid."""
    if local_tp >= remote_tp:
        return local_tp // remote_tp if local_tp % remote_tp == 0 else None
    return -(remote_tp // local_tp) if remote_tp % local_tp == 0 else None


class _Pair:
    """Shared context for the rule functions: who is who and how to word a finding."""

    def __init__(self, p: Geometry, d: Geometry) -> None:
        self.p, self.d = p, d
        self.k = d.architecture.num_kv_heads
        self.mla = d.architecture.is_mla
        self.pm, self.dm = p.stages[0].metadata, d.stages[0].metadata

    def finding(self, check: str, factor: str, pv: Any, dv: Any, what: str, fix: str) -> Finding:
        msg = (f"producer {self.p.engine} -> consumer {self.d.engine}: {what} "
               f"({factor}: {self.p.engine}={pv!r}, {self.d.engine}={dv!r})")
        return Finding(check=check, producer=self.p.engine, consumer=self.d.engine, factor=factor,
                       producer_value=pv, consumer_value=dv, message=msg, fix=fix)

    @property
    def remote_replicated(self) -> bool:
        return self.mla or self.p.tp > self.k


def _hash(c: _Pair) -> Iterator[Finding]:
    pf, df = c.p.hash_factors, c.d.hash_factors
    for name in differing_factors(pf, df):
        yield c.finding("compatibility_hash", name, pf.get(name), df.get(name),
                        "NIXL compatibility hash mismatch; the handshake is refused",
                        FIX_BY_FACTOR.get(name, "make the factor equal on both engines"))


def _pipeline(c: _Pair) -> Iterator[Finding]:
    if c.d.pp > 1:
        yield c.finding("pipeline_parallel", "pipeline_parallel_size", c.p.pp, c.d.pp,
                        "a consumer with PP>1 is NotImplemented in the NIXL connector",
                        f"launch {c.d.engine} with --pipeline-parallel-size 1")
    facts = facts_for(c.p.plan.vllm_version)
    if c.p.pp > 1 and c.p.plan.transfer_mode == "pull" and not facts.pull_producer_pp_supported:
        yield c.finding("pipeline_parallel", "pipeline_parallel_size", c.p.pp, c.d.pp,
                        f"a pull-mode producer with PP>1 cannot be read in vLLM {facts.release}",
                        f"launch {c.p.engine} with --pipeline-parallel-size 1 (use TP instead)")


def _blocks(c: _Pair, ratio: int) -> Iterator[Finding]:
    lk, rk = c.dm.block_size, c.pm.block_size
    if lk % rk:
        yield c.finding("kernel_block_size", "block_size", rk, lk,
                        f"Local block size {lk} is not divisible by remote block size {rk}",
                        "pin the same --block-size on both (the consumer's kernel block must be "
                        "a multiple of the producer's)")
    elif lk != rk and not c.remote_replicated and ratio < 0:
        yield c.finding("kernel_block_size", "block_size", rk, lk,
                        "different kernel block sizes are not supported when the producer has "
                        "more TP ranks than the consumer", "pin the same --block-size on both")


def _layout(c: _Pair, ratio: int) -> Iterator[Finding]:
    if c.mla:
        return  # MLA: H = 1, vLLM skips the layout checks
    if c.pm.kv_cache_layout != c.dm.kv_cache_layout:
        yield c.finding("kv_cache_layout", "kv_cache_layout", c.pm.kv_cache_layout,
                        c.dm.kv_cache_layout,
                        "Heterogeneous TP expects same kv_cache_layout (raised even at equal TP)",
                        "use the same attention backend and VLLM_KV_CACHE_LAYOUT on both engines")
    if abs(ratio) != 1 and not c.remote_replicated and c.dm.kv_cache_layout not in BLOCK_CONTIGUOUS:
        yield c.finding("kv_cache_layout", "kv_cache_layout", c.pm.kv_cache_layout,
                        c.dm.kv_cache_layout,
                        "Heterogeneous TP head-dimension splitting requires contiguous heads",
                        "use a backend that allows LBHNC (unset VLLM_KV_CACHE_LAYOUT=NHD/LBNHC) "
                        "or equal TP on both engines")


def _replication(c: _Pair) -> Iterator[Finding]:
    if not c.mla and not c.d.has_mamba and c.p.tp > c.d.tp and c.p.tp > c.k:
        yield c.finding("gqa_replication", "tensor_parallel_size", c.p.tp, c.d.tp,
                        f"the producer replicates KV heads (TP {c.p.tp} > {c.k} KV heads) and has "
                        "more ranks than the consumer", f"give {c.p.engine} TP <= {c.k} or "
                        f"give {c.d.engine} TP >= {c.p.tp}")


def _block_lens(c: _Pair, ratio: int) -> Iterator[Finding]:
    if c.pm.num_regions != c.dm.num_regions:
        yield c.finding("regions", "num_regions", c.pm.num_regions, c.dm.num_regions,
                        "the engines register a different number of KV regions",
                        "serve the same model with the same HMA setting and PP layout")
        return
    if c.d.has_mamba or c.p.has_mamba or not c.dm.block_lens:
        return
    bsr = c.dm.block_size // c.pm.block_size
    local, remote = c.dm.block_lens[0], c.pm.block_lens[0]
    lh, rh = max(1, c.k // c.d.tp), max(1, c.k // c.p.tp)
    if c.remote_replicated:
        ok = local == remote * bsr
    elif ratio > 0:
        ok = remote * lh * bsr == local * rh
    else:
        ok = remote * lh == local * rh
    if not ok:
        yield c.finding("block_len", "block_lens", remote, local,
                        "remote block length does not match the local one scaled by heads and "
                        "block size", "serve the same model, kv-cache dtype and block size on both")


def _mamba(c: _Pair) -> Iterator[Finding]:
    if not (c.d.has_mamba or c.p.has_mamba):
        return
    for g in (c.p, c.d):
        if g.plan.ssm_conv_state_layout != "DS":
            yield c.finding("mamba_conv_state_layout", "VLLM_SSM_CONV_STATE_LAYOUT",
                            c.p.plan.ssm_conv_state_layout, c.d.plan.ssm_conv_state_layout,
                            f"{g.engine} keeps Mamba conv state as SD; NIXL refuses it at startup",
                            f"set VLLM_SSM_CONV_STATE_LAYOUT=DS on {g.engine}")
    prefix = c.d.plan.enable_prefix_caching or c.p.plan.enable_prefix_caching
    pr, dr = (c.pm.physical_blocks_per_logical_kv_block,
              c.dm.physical_blocks_per_logical_kv_block)
    if prefix and pr != dr:
        yield c.finding("mamba_prefix_caching", "physical_blocks_per_logical_kv_block",
                        c.pm.physical_blocks_per_logical_kv_block,
                        c.dm.physical_blocks_per_logical_kv_block,
                        "Mamba hybrids with prefix caching need equal kernel blocks per block",
                        "pin the same --block-size and backend, or --no-enable-prefix-caching")


def check_pair(producer: Geometry, consumer: Geometry) -> PairReport:
    """Every predicted reason `consumer` cannot read KV from `producer` (pull mode)."""
    c = _Pair(producer, consumer)
    findings = [*_hash(c), *_pipeline(c)]
    ratio = tp_ratio(consumer.tp, producer.tp)
    if ratio is None:
        findings.append(c.finding(
            "tp_divisibility", "tensor_parallel_size", producer.tp, consumer.tp,
            "the TP sizes do not divide each other", "use TP sizes where one divides the other"))
    else:
        block_findings = list(_blocks(c, ratio))
        findings.extend([*block_findings, *_replication(c), *_layout(c, ratio)])
        if not block_findings:  # the block_len equations assume nested kernel blocks
            findings.extend(_block_lens(c, ratio))
    findings.extend(_mamba(c))
    return PairReport(producer=producer.engine, consumer=consumer.engine,
                      hash_equal=producer.compatibility_hash == consumer.compatibility_hash,
                      tp_ratio=ratio, findings=findings)


def check_fleet(engines: Sequence[Geometry]) -> list[PairReport]:
    """Every ordered producer -> consumer pair of distinct engines (kv_both engines play both)."""
    return [check_pair(p, d) for p in engines for d in engines if p is not d]
