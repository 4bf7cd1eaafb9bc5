"""Fixtures for the injector tests: a fixed trust anchor, a mesh configuration, the sample workloads."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tether.injector.config import MeshConfig
from tether.resources.loading import load_path

from .helpers import ANCHOR_FILE, WORKLOADS_FILE


@pytest.fixture(scope="session")
def anchors_pem() -> str:
    return ANCHOR_FILE.read_text()


@pytest.fixture(scope="session")
def config(anchors_pem: str) -> MeshConfig:
    return MeshConfig(trust_anchors_pem=anchors_pem)


@pytest.fixture
def workloads() -> dict[str, dict[str, Any]]:
    """Fresh copies of the objects in data/workloads.yaml, by kind."""
    return {obj["kind"]: copy.deepcopy(obj) for _, _, obj in load_path(WORKLOADS_FILE)}
