"""Package layout (metadata is in pyproject.toml).

Only ``omni_rt`` is installed. The repository keeps the preset files in top-level ``models/`` and the demo
page in ``web/``; they ship as package data ``omni_rt/_presets`` and ``omni_rt/_web`` (``package_dir`` maps
the folders; ``omni_rt.resources`` finds either location). ``latency_bench/`` and ``tests/`` stay in the repo.
Why a setup.py: pyproject's ``packages.find`` cannot add packages that live outside the package tree.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["omni_rt", "omni_rt.*"]) + ["omni_rt._presets", "omni_rt._web"],
    package_dir={"omni_rt._presets": "models", "omni_rt._web": "web"},
    package_data={"omni_rt._presets": ["*.yaml", "*.toml"], "omni_rt._web": ["*.html", "*.js", "*.css", "*.svg", "*.png"]},
    include_package_data=False,
)
