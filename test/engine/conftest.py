"""Engine tests build the built-in tiny checkpoint once, in a cache folder of their own."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope='session', autouse=True)
def private_cache_dir(tmp_path_factory):
    """Point the checkpoint cache (for this process and engine processes) at a temp folder."""
    path = tmp_path_factory.mktemp('cache')
    old = os.environ.get('XDG_CACHE_HOME')
    os.environ['XDG_CACHE_HOME'] = str(path)
    yield path
    if old is None:
        os.environ.pop('XDG_CACHE_HOME', None)
    else:
        os.environ['XDG_CACHE_HOME'] = old
