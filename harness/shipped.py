"""What people ship instead of a tuned configuration, as points this project measures.

For every golden shape of a GPU card the own slice measures, first:

- ``heuristic``: the one configuration a shipped rule picks without measuring.  Row-wise kinds
  (``rms_norm``, ``softmax``, ``reduce``): the ``calculate_settings`` rule of unsloth and
  Liger-Kernel (BLOCK_SIZE the next power of two of the row length, at most 65536; 4 warps,
  8 from 2048, 16 from 8192, 32 from 32768), one row per program, one pass where the kind
  has the choice.  Matmul-like kinds: the first configuration of the Triton matmul tutorial's
  ``get_cuda_autotune_config``; attention: the first of the fused-attention tutorial's list.
- ``autotune_list``: every configuration of those tutorial lists (what ``triton.autotune``
  would time, one measurement each); the kinds with no published list have none.
- ``descriptor_list`` (cards of compute capability 9.0 and later): the lists the same tutorials
  publish for their tensor-descriptor kernels, on this project's descriptor paths: the
  persistent matmul tutorial's ``matmul_tma_persistent_get_configs`` (``TMA=1``,
  ``PERSISTENT=1``, ``SUBTILE`` from its ``EPILOGUE_SUBTILE``; norm_linear's norm in a pass
  of its own, ``PROLOGUE=2``, as a user would run it before that GEMM) for the GEMM kinds, the
  fused-attention tutorial's ``configs_tma`` filtered by its ``keep_tma`` (``TMA=1``) for
  attention.  They are measured early like the rest; no prior is built from them.
- two baselines a user would run instead of a Triton kernel: ``baseline=torch`` (torch's own
  best op in the input dtype: ``F.rms_norm``, ``torch.softmax``, ``F.linear``,
  ``F.scaled_dot_product_attention``, compositions of them for the fused kinds) and
  ``baseline=compile`` (``torch.compile(mode="max-autotune-no-cudagraphs")`` of the reference:
  Inductor's own kernels).  Their spec is ``baseline=NAME``: no prior takes them for a
  configuration (:func:`is_baseline`).

A tile larger than the problem is clamped to it (the same work; the pools never hold such a
tile), and a configuration this card cannot run (its shared memory, its registers) is left
out, as ``triton.autotune`` drops one that fails to compile.  The sources are named in
:data:`SOURCES`.  Stdlib only: imported on the box.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.cards import INTERPRET, Card
from harness.contract import BASELINES, parse_baselines  # noqa: F401 - the option's parser
from harness.kinds.base import completed, next_pow2
from harness.points import make_spec

BASELINE_KNOB = "baseline"
# torch.compile's baseline costs seconds a shape (Inductor's compile and autotuning), a
# configuration tens of milliseconds: the planner counts these points apart
COMPILE_SPEC = f"{BASELINE_KNOB}=compile"
HEURISTIC, AUTOTUNE_LIST, DESCRIPTOR_LIST = "heuristic", "autotune_list", "descriptor_list"
ROW_KINDS = ("rms_norm", "softmax", "reduce")
GEMM_KINDS = ("matmul", "mlp_geglu", "norm_linear", "linear_norm")

SOURCES = {
    "calculate_settings": {
        "repository": "github.com/unslothai/unsloth (unsloth/kernels/utils.py) and "
                      "github.com/linkedin/Liger-Kernel (src/liger_kernel/ops/utils.py)",
        "rule": "BLOCK_SIZE = next_power_of_2(n) (at most 65536); num_warps 4, 8 if "
                "BLOCK_SIZE >= 2048, 16 if >= 8192, 32 if >= 32768"},
    "matmul_tutorial": {
        "repository": "github.com/triton-lang/triton",
        "path": "python/tutorials/03-matrix-multiplication.py (get_cuda_autotune_config)",
        "commit": "7649d87cce6c12361bb9da234b9b227b2880b499"},
    "attention_tutorial": {
        "repository": "github.com/triton-lang/triton",
        "path": "python/tutorials/06-fused-attention.py (configs, filtered by keep)",
        "commit": "dc6ee3ed2cf9b2b436544d6153351f9bc679cc61"},
    "persistent_matmul_tutorial": {
        "repository": "github.com/triton-lang/triton",
        "path": "python/tutorials/09-persistent-matmul.py (matmul_tma_persistent_get_configs)",
        "commit": "02936a198800b2c0180cf63f2a69e776bcca6d7d"},
    "attention_tutorial_tma": {
        "repository": "github.com/triton-lang/triton",
        "path": "python/tutorials/06-fused-attention.py (configs_tma, filtered by keep_tma)",
        "commit": "003da478d84f5bb0f51b3988cf0ea0bbe60282b7"},
}

# get_cuda_autotune_config: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, num_stages,
# num_warps), in the tutorial's order
MATMUL_TUTORIAL = (
    (128, 256, 64, 8, 3, 8), (64, 256, 32, 8, 4, 4), (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4), (64, 128, 32, 8, 4, 4), (128, 32, 32, 8, 4, 4),
    (64, 32, 32, 8, 5, 2), (32, 64, 32, 8, 5, 2),
    (128, 256, 128, 8, 3, 8), (256, 128, 128, 8, 3, 8), (256, 64, 128, 8, 4, 4),
    (64, 256, 128, 8, 4, 4), (128, 128, 128, 8, 4, 4), (128, 64, 64, 8, 4, 4),
    (64, 128, 64, 8, 4, 4), (128, 32, 64, 8, 4, 4),
)


def _attention_tutorial() -> tuple[tuple[int, int, int, int], ...]:
    """(BLOCK_M, BLOCK_N, num_stages, num_warps): BM in (64, 128), BN in (32, 64), stages in
    (3, 4, 7), warps in (4, 8), without 8 warps where BLOCK_M * BLOCK_N < 128 * 128 (keep)."""
    return tuple((bm, bn, s, w) for bm in (64, 128) for bn in (32, 64) for s in (3, 4, 7)
                 for w in (4, 8) if not (bm * bn < 128 * 128 and w == 8))


ATTENTION_TUTORIAL = _attention_tutorial()

# matmul_tma_persistent_get_configs: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M,
# num_stages, num_warps, EPILOGUE_SUBTILE), in the tutorial's order
PERSISTENT_MATMUL_TUTORIAL = tuple((128, bn, bk, 8, s, w, sub) for bn in (128, 256)
                                   for bk in (64, 128) for s in (2, 3, 4) for w in (4, 8)
                                   for sub in (1, 0))


def _attention_tutorial_tma() -> tuple[tuple[int, int, int, int], ...]:
    """(BLOCK_M, BLOCK_N, num_stages, num_warps) of ``configs_tma``: BM in (64, 128), BN in
    (32, 64, 128), stages in (2, 3, 4, 6), warps in (4, 8), without 8 warps where
    BLOCK_M * BLOCK_N < 128 * 128 (``keep_tma`` on compute capability 9)."""
    return tuple((bm, bn, s, w) for bm in (64, 128) for bn in (32, 64, 128)
                 for s in (2, 3, 4, 6) for w in (4, 8)
                 if not (bm * bn < 128 * 128 and w == 8))


ATTENTION_TUTORIAL_TMA = _attention_tutorial_tma()


def calculate_settings(n: int) -> tuple[int, int] | None:
    """(BLOCK_SIZE, num_warps) of the rule; None where it refuses (rows over 65536)."""
    block = next_pow2(n)
    if block > 65536:
        return None
    warps = 32 if block >= 32768 else 16 if block >= 8192 else 8 if block >= 2048 else 4
    return block, warps


def is_baseline(spec_or_knobs: str | Mapping[str, Any]) -> bool:
    """Whether a row's spec (or knobs) is a baseline, not a configuration."""
    if isinstance(spec_or_knobs, str):
        return spec_or_knobs.startswith(f"{BASELINE_KNOB}=")
    return BASELINE_KNOB in spec_or_knobs


def _clamp_tiles(knobs: dict[str, Any], shape: Mapping[str, Any], dims: Mapping[str, str]
                 ) -> dict[str, Any]:
    for knob, dim in dims.items():
        if knob in knobs:
            knobs[knob] = min(knobs[knob], max(16, next_pow2(shape[dim])))
    return knobs


def _row_config(kind: str, shape: Mapping[str, Any]) -> dict[str, Any] | None:
    got = calculate_settings(shape["N"])
    if got is None:
        return None
    block, warps = got
    knobs: dict[str, Any] = {"BLOCK_N": block, "ROWS": 1, "num_warps": warps, "num_stages": 1}
    if kind == "reduce":
        knobs["SPLIT"] = 1
    else:
        knobs["ONE_PASS"] = 1
    return knobs


def gemm_knobs(kind: str, shape: Mapping[str, Any], *, bm: int, bn: int, bk: int, group: int,
               warps: int, stages: int) -> dict[str, Any]:
    """A published GEMM configuration as ``kind``'s knobs for ``shape``, in the one spelling
    the knob spaces hold: a tile larger than the problem is clamped to it, and a ``GROUP_M`` at
    least twice the M tiles becomes the smallest power of two that holds them all (one group
    either way: the same launch order).  The fused kinds take their knobs' first values:
    norm_linear ``PROLOGUE=0`` (the norm folded into the main loop), linear_norm
    ``ROW_PROGRAM=0`` (a GEMM program per tile); the descriptor lists set norm_linear's norm
    as a pass of its own (``PROLOGUE=2``) themselves."""
    knobs: dict[str, Any] = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group,
                             "num_warps": warps, "num_stages": stages}
    if kind == "norm_linear":
        knobs["PROLOGUE"] = 0
    if kind == "linear_norm":
        knobs["ROW_PROGRAM"] = 0
    _clamp_tiles(knobs, shape, {"BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K"})
    m_tiles = -(-shape["M"] // knobs["BLOCK_M"])
    if group > 1 and m_tiles <= group // 2:
        knobs["GROUP_M"] = 1 if m_tiles == 1 else next_pow2(m_tiles)
    return knobs


def _gemm_config(kind: str, shape: Mapping[str, Any], cfg: tuple[int, ...]) -> dict[str, Any]:
    bm, bn, bk, group, stages, warps = cfg  # the tutorial's order
    return gemm_knobs(kind, shape, bm=bm, bn=bn, bk=bk, group=group, warps=warps, stages=stages)


def _attention_config(shape: Mapping[str, Any], cfg: tuple[int, ...]) -> dict[str, Any]:
    bm, bn, stages, warps = cfg
    knobs: dict[str, Any] = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps,
                             "num_stages": stages}
    return _clamp_tiles(knobs, shape, {"BLOCK_M": "seq", "BLOCK_N": "seq"})


def _descriptor_listed(kind: str, shape: Mapping[str, Any]) -> list[dict[str, Any]]:
    if kind in GEMM_KINDS:
        out = []
        for bm, bn, bk, group, stages, warps, sub in PERSISTENT_MATMUL_TUTORIAL:
            knobs = gemm_knobs(kind, shape, bm=bm, bn=bn, bk=bk, group=group, warps=warps,
                               stages=stages)
            if kind == "norm_linear":  # the norm as its own pass before the tutorial's GEMM
                knobs["PROLOGUE"] = 2
            out.append({**knobs, "TMA": 1, "PERSISTENT": 1, "SUBTILE": sub})
        return out
    if kind == "attention":
        return [{**_attention_config(shape, c), "TMA": 1} for c in ATTENTION_TUTORIAL_TMA]
    return []


def _listed(kind: str, shape: Mapping[str, Any]) -> list[dict[str, Any]]:
    if kind in GEMM_KINDS:
        return [_gemm_config(kind, shape, c) for c in MATMUL_TUTORIAL]
    if kind == "attention":
        return [_attention_config(shape, c) for c in ATTENTION_TUTORIAL]
    return []


def _runnable(kind_name: str, knobs: dict[str, Any], shape: Mapping[str, Any], card: Card
              ) -> bool:
    from harness import kinds as registry

    try:
        return registry.get(kind_name).unrealizable(knobs, shape, card) is None
    except (KeyError, TypeError, ValueError):
        return False


def _unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for k in configs:
        spec = make_spec(k)
        if spec not in seen:
            seen.add(spec)
            out.append(k)
    return out


def autotune_list(kind: str, shape: Mapping[str, Any], card: Card) -> list[dict[str, Any]]:
    """The published list's configurations this card can run, in the list's order."""
    return _unique([_full(kind, k, shape, card) for k in _listed(kind, shape)
                    if _runnable(kind, k, shape, card)])


def descriptor_list(kind: str, shape: Mapping[str, Any], card: Card) -> list[dict[str, Any]]:
    """The tutorials' tensor-descriptor lists as configurations this card can run, in the
    lists' order; none on a card without the descriptor paths (compute capability < 9.0)."""
    if card.cc < (9, 0):
        return []
    return _unique([_full(kind, k, shape, card) for k in _descriptor_listed(kind, shape)
                    if _runnable(kind, k, shape, card)])


def _full(kind_name: str, knobs: dict[str, Any], shape: Mapping[str, Any],
          card: Card) -> dict[str, Any]:
    """A published configuration in the kind's knobs on ``card``: the knobs it predates (the
    GEMM kinds' TMA paths) at their first value, as the kernel it was published for ran."""
    from harness import kinds as registry

    return completed(knobs, registry.get(kind_name).knob_space(shape, card))


def heuristic(kind: str, shape: Mapping[str, Any], card: Card) -> dict[str, Any] | None:
    """The rule's one configuration (None: no rule, or none this card can run).  For the
    tutorial lists it is the first configuration this card can run, as a user who takes the
    tutorial's first config and hits a resource error would take the next one."""
    if kind in ROW_KINDS:
        knobs = _row_config(kind, shape)
        if knobs is None or not _runnable(kind, knobs, shape, card):
            return None
        return _full(kind, knobs, shape, card)
    runnable = autotune_list(kind, shape, card)
    return runnable[0] if runnable else None


def configs(kind: str, shape: Mapping[str, Any], card: Card,
            baselines: tuple[str, ...] = BASELINES) -> dict[str, list[dict[str, Any]]]:
    """role → configurations of one shape on ``card``: ``heuristic`` (zero or one),
    ``autotune_list``, ``descriptor_list`` and ``baseline`` (those in ``baselines``).  None on
    the interpreter (its knob spaces are toys)."""
    if card.regime == INTERPRET:
        return {}
    h = heuristic(kind, shape, card)
    return {HEURISTIC: [h] if h else [], AUTOTUNE_LIST: autotune_list(kind, shape, card),
            DESCRIPTOR_LIST: descriptor_list(kind, shape, card),
            "baseline": [{BASELINE_KNOB: b} for b in baselines]}
