"""Builds a tiny random-weight Llama that vLLM can serve, offline: no hub, no download.

Usage: python tiny_llama.py OUT_DIR [TEXT_FILE...]

The weights are random (seeded), so the text it generates is gibberish; what the engine tests
exercise is real all the same: vLLM's tokenizer path, scheduler, KV cache of 128-token blocks on
its CPU backend, preemption and metrics. The tokenizer is a byte-level BPE trained on the given
text files (the repository's docs by default), so every string has a tokenization, and it is
saved with a chat template so /v1/chat/completions works. Run with the interpreter of the venv
vLLM lives in (it has torch, transformers and tokenizers).
"""

from __future__ import annotations

import sys
from pathlib import Path

CONTEXT = 2048  # max_position_embeddings: 1,500-token replies plus their prompts fit
VOCAB = 2048
SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build(out: Path, texts: list[Path]) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train([str(path) for path in texts], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<|bos|>", eos_token="<|eos|>",
        pad_token="<|pad|>", model_max_length=CONTEXT)
    fast.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id, tie_word_embeddings=True, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[0])
    texts = [Path(a) for a in argv[1:]]
    if not texts:
        docs = Path(__file__).resolve().parents[2] / "docs"
        texts = sorted(docs.glob("*.md"))
    build(out, texts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
