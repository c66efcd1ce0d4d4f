"""A tiny llama-architecture GGUF model with random weights, written on the spot.

What the real llama.cpp server (tests/e2e/test_llama_cpp_server.py) loads: two layers
of width 64, a SentencePiece-style vocabulary (control tokens, the 256 byte-fallback
tokens, a few word pieces) so any prompt tokenizes, and random F32 weights (the point
is the server's protocol, token counts and timing, not its text). Written with
llama.cpp's own ``gguf`` package; a few hundred KB, in milliseconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 64, 4, 2, 128, 2048
#: Word pieces beside the single letters (each token once: llama.cpp refuses a vocabulary with duplicates).
PIECES = ["\u2581the", "\u2581GPU", "\u2581is", "\u2581of", "\u2581and", "\u2581to", "\u2581in"]


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (gguf.TokenType) of a byte-fallback SentencePiece vocabulary."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    letters = [f"\u2581{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz")
    tokens += ["\u2581", *PIECES, *letters]
    types += [gguf.TokenType.NORMAL] * (1 + len(PIECES) + len(letters))
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama(path: Path, seed: int = 0) -> Path:
    """Write the model to ``path`` and return it."""
    import gguf

    tokens, scores, types = vocabulary()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:  # numpy shape is GGUF's dimensions reversed
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("gpubench-tiny-llama")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", weights(vocab, N_EMBD))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.add_tensor("output.weight", weights(vocab, N_EMBD))
    for layer in range(N_LAYER):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{block}.{name}.weight", weights(N_EMBD, N_EMBD))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weights(N_FF, N_EMBD))
        writer.add_tensor(f"{block}.ffn_up.weight", weights(N_FF, N_EMBD))
        writer.add_tensor(f"{block}.ffn_down.weight", weights(N_EMBD, N_FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
