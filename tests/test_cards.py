"""The card catalog: aliases, canonical names, live-name canonicalization."""

from __future__ import annotations

import pytest

from harness import cards


@pytest.mark.parametrize("alias", ["l40s", "h100", "h200", "a100-40", "a100-80", "rtx4090",
                                   "rtx5090", "b200", "interpret", "l4", "a10g", "a10", "l40",
                                   "rtx6000-ada", "rtxa6000", "rtxpro6000", "rtxpro6000-server",
                                   "h100-pcie", "h100-nvl", "a100-80-pcie", "a100-40-pcie", "h20",
                                   "gh200"])
def test_required_aliases_resolve(alias: str) -> None:
    card = cards.by_alias(alias)
    assert alias in card.aliases
    assert cards.by_name(card.name) is card


@pytest.mark.parametrize(("live", "alias"), [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA L40S", "l40s"),
    ("NVIDIA A100-SXM4-80GB", "a100-80"), ("NVIDIA A100-SXM4-40GB", "a100-40"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA B200", "b200"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"), ("NVIDIA A10", "a10"), ("NVIDIA L40", "l40"), ("NVIDIA H20", "h20"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"), ("NVIDIA RTX A6000", "rtxa6000"),
    ("NVIDIA A100-PCIE-40GB", "a100-40-pcie"), ("NVIDIA A100 80GB PCIe", "a100-80-pcie"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000-server"),
])
def test_live_names_canonicalize(live: str, alias: str) -> None:
    assert cards.canonicalize(live) is cards.by_alias(alias)


@pytest.mark.parametrize("live", ["NVIDIA H800 PCIe", "NVIDIA A800 80GB PCIe", "Tesla T4", ""])
def test_unknown_or_variant_names_are_not_guessed(live: str) -> None:
    assert cards.canonicalize(live) is None


def test_unknown_alias_suggests_the_nearest_and_lists_the_valid_ones() -> None:
    with pytest.raises(cards.UnknownCardError, match=r"unknown card 'l4os'; did you mean 'l40s'\? "
                                                     r"valid aliases: l40s, l40, l4"):
        cards.by_alias("l4os")
    with pytest.raises(cards.UnknownCardError, match=r"unknown card 'zz9'; valid aliases: "):
        cards.by_alias("zz9")


def test_names_are_unique_and_limits_sane() -> None:
    names = [c.name for c in cards.CATALOG]
    assert len(names) == len(set(names))
    aliases = cards.aliases()
    assert len(aliases) == len(set(aliases))
    for c in cards.CATALOG:
        if c.regime == cards.DEPLOYABLE:
            assert c.sm_count > 0 and c.smem_optin >= 96 * 1024 and c.l2_bytes > 0
            assert c.peak_fp16_tflops > c.peak_fp32_tflops > 0
    assert cards.by_alias("h200").smem_optin > cards.by_alias("l40s").smem_optin


def test_gpu_option_parsing() -> None:
    assert cards.parse_gpu_option("L40S, h100") == ["l40s", "h100"]
    assert cards.parse_gpu_option("local") == ["local"]
    with pytest.raises(cards.UnknownCardError, match="cannot be combined"):
        cards.parse_gpu_option("auto,h100")
    with pytest.raises(cards.UnknownCardError, match="names no card"):
        cards.parse_gpu_option(" , ")


def test_the_box_extra_pins_what_box_install_installs() -> None:
    """``--box-install`` installs exactly the ``box`` extra of pyproject.toml."""
    import re
    from pathlib import Path

    from harness.contract import BOX_PINS

    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    box = re.search(r"^box = \[(.*)\]$", text, re.M)
    assert box, "no box extra in pyproject.toml"
    assert tuple(re.findall(r'"([^"]+)"', box[1])) == BOX_PINS
