"""Replace repository-internal paper paths (``papers/NNN``) by citations a reader can look up.

The docstrings and tutorials of bam_ppl still cite some papers by their file number in the
development repository; the documentation site shows authors, year and arXiv id instead.
"""

from __future__ import annotations

import re

PAPERS = {
    "000": "Cemgil et al. 2019, arXiv:1903.04478",
    "001": "Chege, Yeredor & Haardt 2024, arXiv:2410.06329",
    "002": "Lumbreras, Filstroff & Févotte 2020, arXiv:1812.06866",
    "003": "Zhang & Linderman, Technical Description of Dirichlet Tucker Decomposition",
    "004": "Kurutmaz et al., Bayesian Learning of Non-Negative Matrix/Tensor Factorizations by "
           "Simulating Pólya Urns",
}

_PATH = re.compile(r"(?:\.\./)*(?:shared/)?papers/(\d{3})(?:_[0-9a-f]+\.txt)?(\s+(?=[§A-Za-z0-9]))?")
_DESIGN = re.compile(r"\s*\((?:see )?DESIGN(?:\.md)? ?§\s*\d+\)")


def _cite(match: re.Match) -> str:
    text = PAPERS.get(match.group(1), f"paper {match.group(1)}")
    return text + (", " if match.group(2) else "")


def cite(text: str) -> str:
    """``text`` with every ``papers/NNN`` replaced by authors, year and arXiv id."""
    return _DESIGN.sub("", _PATH.sub(_cite, text))


def find_paths(text: str) -> list[str]:
    return sorted(set(m.group(0).strip() for m in _PATH.finditer(text)))
