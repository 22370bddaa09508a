"""Gemma 3 (text) where it must differ from mlx-lm's gemma3_text: the embedding scale.

mlx-lm multiplies the embeddings by sqrt(hidden) rounded to bfloat16 (what Hugging Face does for a bfloat16
checkpoint); llama.cpp multiplies by sqrt(hidden) in float32. A GGUF is meant to run as llama.cpp runs it, so
this model scales in float32 (for hidden = 640: 25.2982 instead of 25.25). The rest is mlx-lm's class."""

from __future__ import annotations

import math
from typing import Optional

import mlx.core as mx
from mlx_lm.models import gemma3_text
from mlx_lm.models.base import create_attention_mask


class Gemma3Model(gemma3_text.Gemma3Model):
    def __call__(self, inputs: mx.array, cache=None, input_embeddings: Optional[mx.array] = None):
        h = input_embeddings if input_embeddings is not None else self.embed_tokens(inputs)
        h = h * math.sqrt(self.args.hidden_size)
        if cache is None:
            cache = [None] * len(self.layers)
        pattern = self.sliding_window_pattern
        global_mask = create_attention_mask(h, cache[pattern - 1] if pattern <= len(cache) else None)
        local_mask = create_attention_mask(h, cache[0], window_size=self.window_size) if pattern > 1 else None
        for i, (layer, c) in enumerate(zip(self.layers, cache)):
            h = layer(h, global_mask if i % pattern == pattern - 1 else local_mask, c)
        return self.norm(h)


class Model(gemma3_text.Model):
    def __init__(self, args: gemma3_text.ModelArgs):
        super().__init__(args)
        self.model = Gemma3Model(args)
