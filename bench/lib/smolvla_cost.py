"""The floor of a SmolVLA step: pi0's (``bench.lib.pi0_cost``: a prefix pass, then
``num_steps`` denoising passes, each the longer of its FLOPs at the matmul rate and its
weights over the copy bandwidth), with SmolVLA's parameters where its passes use them.

The prefix pass runs the kept text layers (``num_vlm_layers``, no embedding table: rows are
gathered) over every prefix position, the cross layers' ``k_proj`` / ``v_proj`` over the
same positions (the cross caches are filled once per prefix) and the state projection;
the tower over every camera's patches and the connector over its tokens (the pixel shuffle
folds ``scale_factor ** 2`` patches into one, so the connector counts as ``1 / scale ** 2`` of
its parameters per patch; its bytes count whole). A denoising pass runs the expert without
the cross layers' ``k_proj`` / ``v_proj`` over the chunk, and the action and time
projections. SmolVLA base at real sizes (16 text layers 960 wide, the expert 720 wide, the
tower 768 wide over 1,024 patches of a 512-pixel image, 64 tokens a camera), two cameras and
a 6-token prompt (135 prefix positions): 0.06 TFLOP of text layers and 0.18 TFLOP of tower
a step's prefix, 0.01 TFLOP a denoising pass of 50 actions.
"""

from __future__ import annotations

from bench.lib.pi0_cost import Pi0Shape

ACTION_HEADS = ('action_in_proj', 'action_out_proj', 'action_time_mlp_in', 'action_time_mlp_out')


def _count(params) -> tuple[int, int]:
    params = list(params)
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def smolvla_shape(
    model, *, num_images: int, prefix_len: int, chunk_size: int, num_steps: int
) -> Pi0Shape:
    """The ``Pi0Shape`` of a loaded ``SmolVLAModel`` whose steps have ``num_images`` cameras
    and prefixes of ``prefix_len`` positions (see the module docstring)."""
    cross = set(model.sizes.cross_layers)
    cross_kv = [
        p
        for i, layer in enumerate(model.expert)
        if i in cross
        for p in (*layer.self_attn.k_proj.parameters(), *layer.self_attn.v_proj.parameters())
    ]
    cross_ids = {id(p) for p in cross_kv}
    text = [p for name, p in model.language.named_parameters() if 'embed' not in name]
    language = _count([*text, *cross_kv, *model.state_proj.parameters()])
    tower = _count(model.vision_tower.parameters())
    connector = _count(model.connector.parameters())
    expert_params = [p for p in model.expert.parameters() if id(p) not in cross_ids]
    expert_params += list(model.expert_norm.parameters())
    for name in ACTION_HEADS:
        expert_params += list(getattr(model, name).parameters())
    expert = _count(expert_params)
    vision = model.sizes.vision
    shuffle = model.sizes.scale_factor**2
    return Pi0Shape(
        language_params=language[0],
        vision_params=tower[0] + connector[0] // shuffle,
        expert_params=expert[0],
        language_bytes=language[1],
        vision_bytes=tower[1] + connector[1],
        expert_bytes=expert[1],
        num_images=num_images,
        num_image_tokens=(vision.image_size // vision.patch_size) ** 2,
        prefix_len=prefix_len,
        suffix_len=chunk_size,
        num_steps=num_steps,
    )
