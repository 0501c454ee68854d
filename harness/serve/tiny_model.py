"""Build the tiny local model: a 2-layer Llama with seeded random weights and a locally trained tokenizer.

No model hub is reachable here, so tests and CPU benchmarks serve this model. Weights are random (outputs
are gibberish), which is fine for serving benchmarks with ignore_eos and for greedy equivalence checks.
Deterministic for a seed: the same seed gives byte-identical weights and tokenizer.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from harness.workload import sharegpt_file as sharegpt

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "data" / "tiny-llama"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    vocab_size: int = 8000
    max_position_embeddings: int = 131072
    seed: int = 0
    recipe: int = 2  # bump when the build code changes, so stale builds are redone


def _training_corpus(num_texts: int = 20000) -> list[str]:
    """The tokenizer learns from ShareGPT text, so token counts of ShareGPT prompts are realistic."""
    texts: list[str] = []
    for conv in sharegpt.iter_conversations():
        texts.extend(turn["value"] for turn in conv["conversations"])
        if len(texts) >= num_texts:
            break
    return texts[:num_texts]


def build_tokenizer(out_dir: Path, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)


def build_model(out_dir: Path, spec: TinyModelSpec) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed)
    cfg = LlamaConfig(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        torch_dtype="float32",
    )
    LlamaForCausalLM(cfg).save_pretrained(out_dir)


def build(out_dir: Path = DEFAULT_DIR, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write the model into out_dir unless a complete build with the same spec is already there."""
    marker = out_dir / "tiny_model_spec.json"
    wanted = json.dumps(spec.__dict__, sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir, spec.vocab_size)
    build_model(out_dir, spec)
    marker.write_text(wanted)  # written last: its presence means the build completed
    return out_dir


def build_tiny(path: Path, family: str = "llama") -> Path:
    """The tiny model of ``family`` in ``path``: the Llama itself, or another family
    (:mod:`harness.serve.tiny_families`) with the Llama's tokenizer."""
    if family == "llama":
        return build(path)
    from harness.serve.tiny_families import build_family

    return build_family(path, family, tokenizer_dir=build(DEFAULT_DIR))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.out, TinyModelSpec(seed=args.seed)))


if __name__ == "__main__":
    main()
