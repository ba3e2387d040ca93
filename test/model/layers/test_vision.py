"""Image preprocessing against transformers' SigLIP processor, and the feature cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_sched.model.layers.vision import FeatureCache, preprocess_image

ONE_LEVEL = 2.0 / 255.0  # one uint8 step after normalizing with mean 0.5, std 0.5


def smooth_image(height: int, width: int) -> np.ndarray:
    rows, cols = np.mgrid[0:height, 0:width]
    channels = [127 + 120 * np.sin(cols / 7 + c) * np.cos(rows / 5) for c in range(3)]
    return np.stack(channels, axis=-1).astype(np.uint8)


@pytest.fixture(scope='module')
def hf_processor(tiny_dir):
    # The PIL processor by name: transformers 5.17's AutoImageProcessor insists on torchvision,
    # and the torchvision one rounds differently (up to 6e-8) from PIL's, which ours follows.
    from transformers import SiglipImageProcessorPil

    return SiglipImageProcessorPil.from_pretrained(tiny_dir)


def test_image_at_tower_size_matches_transformers_exactly(hf_processor, tiny_model):
    image = np.random.default_rng(0).integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    ref = hf_processor(images=image, return_tensors='pt')['pixel_values'][0]
    ours = preprocess_image(image, tiny_model.spec.preprocessing)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize('shape', [(48, 64), (224, 224), (20, 30)])
def test_resized_image_is_within_one_level_of_transformers(hf_processor, tiny_model, shape):
    image = smooth_image(*shape)
    ref = hf_processor(images=image, return_tensors='pt')['pixel_values'][0]
    ours = preprocess_image(image, tiny_model.spec.preprocessing)
    assert ours.shape == (3, 32, 32)
    assert float((ours - ref).abs().max()) <= ONE_LEVEL + 1e-6


@pytest.mark.parametrize(
    'pixels',
    [
        np.zeros((32, 32, 3), np.float32),
        np.zeros((32, 32), np.uint8),
        np.zeros((32, 32, 4), np.uint8),
    ],
)
def test_non_rgb_uint8_images_are_rejected(tiny_model, pixels):
    with pytest.raises(ValueError, match='image must'):
        preprocess_image(pixels, tiny_model.spec.preprocessing)


def test_feature_cache_evicts_the_least_recently_used():
    cache = FeatureCache(max_entries=2)
    cache.put(1, torch.zeros(1))
    cache.put(2, torch.zeros(1))
    assert cache.get(1) is not None  # 1 is now the most recent
    cache.put(3, torch.zeros(1))
    assert 2 not in cache and 1 in cache and 3 in cache
    assert (cache.num_hits, cache.num_misses) == (1, 0)


def test_a_meta_built_tower_gets_its_position_ids_and_refuses_other_unloaded_buffers():
    from torch import nn

    from vla_sched.model.layers.vision import materialize_buffers

    with torch.device('meta'):
        embeddings = nn.Module()
        embeddings.register_buffer('position_ids', torch.arange(5).expand(1, -1), persistent=False)
    tower = nn.Module()
    tower.embeddings = embeddings
    materialize_buffers(tower, 'cpu')
    assert torch.equal(tower.embeddings.position_ids, torch.arange(5)[None])

    with torch.device('meta'):
        tower.embeddings.register_buffer('mask', torch.ones(3), persistent=False)
    with pytest.raises(ValueError, match=r'embeddings\.mask'):
        materialize_buffers(tower, 'cpu')
