"""A tiny random llama-architecture GGUF, written with the gguf package, for fast llama.cpp tests.

2 layers, width 64, a byte-fallback SentencePiece-style vocabulary (the 256 bytes, a few words): about 0.5 MB,
loads and generates in milliseconds. Its text is nonsense; the llama.cpp code path is the real one.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

WORDS = ["▁a", "▁the", "▁cat", "▁dog", "▁photo", "▁sits", "▁in", "▁on", "▁left", "▁right", "▁brown", "."]
DIM, LAYERS, HEADS, FFN, CONTEXT = 64, 2, 4, 128, 1024


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "▁", *WORDS]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (1 + len(WORDS))
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(DIM)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(DIM // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * 259 + [-1.0] + [-float(i) for i in range(len(WORDS))])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")

    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    vocab = len(tokens)
    tensor("token_embd.weight", vocab, DIM)
    writer.add_tensor("output_norm.weight", np.ones(DIM, dtype=np.float32))
    tensor("output.weight", vocab, DIM)
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(DIM, dtype=np.float32))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(DIM, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"{prefix}.{name}.weight", DIM, DIM)
        tensor(f"{prefix}.ffn_gate.weight", FFN, DIM)
        tensor(f"{prefix}.ffn_up.weight", FFN, DIM)
        tensor(f"{prefix}.ffn_down.weight", DIM, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
