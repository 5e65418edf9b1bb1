"""Tiny Llama models for the real-vLLM tests, made on the fly: random weights, a BPE tokenizer
trained here with `tokenizers`, no model hub. Run with the real-vLLM venv's interpreter (it has
torch and transformers): `.vllm-venv/bin/python tests/realvllm/tinymodel.py DIR [VARIANT]`.

Deterministic (seeded weights, a fixed training text), so a cached directory is reused as long as
its recipe is unchanged (`recipe.json` holds it).

Variants:
- "serving": 16 layers, hidden 256, 4 heads of 64 dimensions, 131072 positions. vLLM's CPU KV cache
  is bfloat16: 16 layers x 2 (K, V) x 256 x 2 bytes = 16 KiB per token, so 131072 tokens need
  2 GiB, more than VLLM_CPU_KVCACHE_SPACE=1 holds (scenario 1), while a few thousand tokens fit
  easily (the healthy starts). (4 layers, 4 KiB per token, would fit 131072 tokens in 1 GiB.)
- "short": the same shape with 2048 positions: a --max-model-len above it is vLLM's own refusal
  (scenario 3).
- "head16": hidden 64, 4 heads of 16 dimensions: vLLM 0.32's CPU attention has no kernel for
  head_dim 16, so the engine dies on the first request after /health said 200 (scenario 6).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VARIANTS = {
    "serving": {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 16,
                "intermediate_size": 512, "max_position_embeddings": 131072},
    "short": {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 4,
              "intermediate_size": 512, "max_position_embeddings": 2048},
    "head16": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
               "intermediate_size": 128, "max_position_embeddings": 4096},
}
VOCAB = 512
SEED = 1234
TEXT = ("Reply with the word OK. The quick brown fox jumps over the lazy dog. vLLM serves large language "
        "models; the on-call engineer reads the log, finds the cause and fixes the deployment. ") * 40


def recipe(variant: str) -> dict:
    return {"variant": variant, "vocab": VOCAB, "seed": SEED, "text_len": len(TEXT), **VARIANTS[variant], "v": 2}


def make(folder: Path, variant: str = "serving") -> Path:
    folder = Path(folder)
    marker = folder / "recipe.json"
    if marker.exists() and json.loads(marker.read_text()) == recipe(variant):
        return folder
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(folder)

    torch.manual_seed(SEED)
    config = LlamaConfig(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         torch_dtype="float32", **VARIANTS[variant])
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    marker.write_text(json.dumps(recipe(variant)))
    return folder


if __name__ == "__main__":
    out = make(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "serving")
    print(out)
