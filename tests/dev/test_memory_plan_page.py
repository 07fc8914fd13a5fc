"""The --memory-plan page of a model whose one huge tensor dwarfs the rest:
every box carries its numbers for the log scale and zoom, each tooltip names
its instruction and source line, and a table lists the largest at the peak."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import exirc
from exirc.inspector.memory_report import memory_report
from exirc.inspector.memory_report_html import memory_plan_html
from exirc.inspector.memory_report_page import SCRIPT
from exirc.inspector.render import human_bytes

HUGE = 1 << 18  # elements of the dominant intermediate: 1 MiB of float32


class OneHugeTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        small = torch.relu(x) + 1.0
        huge = small.repeat(1, HUGE // 8)  # the dominant tensor
        return huge.sum(dim=1, keepdim=True) * small


@pytest.fixture(scope="module")
def page() -> str:
    result = exirc.compile(OneHugeTensor(), (torch.randn(1, 8),))
    return memory_plan_html(memory_report(result.program), title="huge.pte")


def _rects(page: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', attributes))
            for attributes in re.findall(r"<rect ([^>]*)>", page)]


def test_controls_and_the_inline_script_are_on_the_page(page: str) -> None:
    assert '<input type="checkbox" class="log-scale">' in page
    assert '<button type="button" class="reset-zoom">reset zoom</button>' in page
    assert '<div class="controls" hidden>' in page  # the script shows them
    assert f"<script>{SCRIPT}</script>" in page
    assert " src=" not in page and "<link" not in page  # nothing fetched: works offline
    assert page.count('<div class="arena-plot">') == page.count("<svg") == 1
    assert re.search(r'<svg [^>]*data-plot="\d+ \d+ \d+ \d+" data-positions="\d+" '
                     r'data-extent="\d+"', page)
    assert re.search(r'<clipPath id="plot-0">', page) and 'clip-path="url(#plot-0)"' in page
    assert '<g class="axis">' in page


def test_every_box_carries_its_offset_bytes_and_lifetime(page: str) -> None:
    rects = _rects(page)
    assert len(rects) >= 4
    for rect in rects:
        assert {"data-offset", "data-bytes", "data-first", "data-last"} <= set(rect)
        assert int(rect["data-first"]) <= int(rect["data-last"])
    sizes = sorted(int(rect["data-bytes"]) for rect in rects)
    assert sizes[-1] == HUGE * 4  # the dominant tensor
    assert sizes[0] * 1000 < sizes[-1]  # drawn linearly, the others are a sliver


def test_tooltips_name_the_instruction_and_its_source_line(page: str) -> None:
    tips = re.findall(r"<rect [^>]*><title>([^<]*)</title>", page)
    assert tips
    for tip in tips:
        assert re.search(r"\nfirst at \d+: .*aten::\w+.* at \S*test_memory_plan_page\.py:\d+ "
                         r"\(forward\)", tip), tip
    huge = next(tip for tip in tips if f"{HUGE * 4} bytes" in tip)
    assert "repeat" in huge


def test_largest_at_peak_table_leads_with_the_dominant_tensor(page: str) -> None:
    table = re.search(r'<table class="largest">(.*?)</table>', page, re.S)
    assert table is not None
    assert "<caption>largest at the peak (position" in table.group(1)
    rows = re.findall(r"<tr><td>(.*?)</tr>", table.group(1), re.S)
    assert rows and human_bytes(HUGE * 4) in rows[0]
    assert "test_memory_plan_page.py:" in rows[0]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_script_is_valid_javascript(tmp_path: Path) -> None:
    script = tmp_path / "page.js"
    script.write_text(SCRIPT)
    check = subprocess.run(["node", "--check", str(script)], capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0, check.stderr
