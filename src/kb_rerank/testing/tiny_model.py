"""Offline builders for cross-encoder checkpoints used by tests and benchmarks.

Nothing here touches a model hub: the tokenizer is a WordPiece tokenizer whose
vocabulary is written from built-in word lists, and the model weights are
randomly initialised.  Both builders write a folder laid out like a Hugging Face
checkpoint (``config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``) so that
``FlagReranker(str(path))``, ``AutoTokenizer.from_pretrained(path)`` and
``AutoModelForSequenceClassification.from_pretrained(path)`` all load it, and so
that :class:`kb_rerank.models.cross_encoder.Reranker` loads it through the same code path the
application uses for ``BAAI/bge-reranker-v2-m3``.

The tiny and bge-reranker-v2-m3 checkpoints use the XLM-RoBERTa architecture and
an ``XLMRobertaTokenizerFast`` wrapper, so pairs are encoded exactly as the
real model encodes them: ``<s> query </s></s> passage </s>``, pad id 1, no
token type ids. :func:`build_random_cross_encoder` writes the published
architecture of each cross-encoder of :data:`CROSS_ENCODER_ARCHS` (BERT,
XLM-RoBERTa, DeBERTa-v2) with random weights, for cost measurements
(``bench/model_cost.py --fit``); BERT and DeBERTa-v2 get the same vocabulary
framed as they frame pairs (one separator, token type ids 0/1).

torch / transformers / tokenizers are imported inside the functions so that
importing this module is cheap.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

__all__ = [
    "CROSS_ENCODER_ARCHS",
    "ArchitectureUnavailable",
    "SPECIAL_TOKENS",
    "build_random_cross_encoder",
    "build_tiny_cross_encoder",
    "build_random_bge_reranker_v2_m3",
    "build_random_injection_model",
    "build_tiny_injection_model",
    "INJECTION_MODEL_ARCHS",
    "cross_encoder_config",
    "build_vocab",
    "sample_words",
]

# Same ids as XLM-RoBERTa for the first four (bos=0, pad=1, eos=2, unk=3).
SPECIAL_TOKENS: tuple[str, ...] = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")

_ASCII = "abcdefghijklmnopqrstuvwxyz0123456789"
_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
# Lowercase Vietnamese letters with diacritics (NFC), so any Vietnamese word
# can at worst be split into single characters instead of becoming <unk>.
_VI_LETTERS = (
    "àáảãạăằắẳẵặâầấẩẫậđèéẻẽẹêềếểễệìíỉĩịòóỏõọôồốổỗộơờớởỡợùúủũụưừứửữựỳýỷỹỵ"
)

_EN_WORDS = """
the of and to a in is it you that he was for on are with as i his they be at one
have this from or had by not word but what some we can out other were all there
when up use your how said an each she which do their time if will way about many
then them write would like so these her long make thing see him two has look more
day could go come did number sound no most people my over know water than call
first who may down side been now find any new work part take get place made live
where after back little only round man year came show every good me give our under
name very through just form sentence great think say help low line differ turn
cause much mean before move right boy old too same tell does set three want air
well also play small end put home read hand port large spell add even land here
must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father head
stand own page should country found answer school grow study still learn plant
cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night
real life few north open seem together next white children begin got walk example
ease paper group always music those both mark often letter until mile river car
feet care second book carry took science eat room friend began idea fish mountain
stop once base hear horse cut sure watch color face wood main enough plain girl
usual young ready above ever red list though feel talk bird soon body dog family
direct pose leave song measure door product black short numeral class wind question
happen complete ship area half rock order fire south problem piece told knew pass
since top whole king space heard best hour better true during hundred five remember
step early hold west ground interest reach fast verb sing listen six table travel
less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice
unit power town fine certain fly fall lead cry dark machine note wait plan figure
star box noun field rest correct able pound done beauty drive stood contain front
teach week final gave green oh quick develop ocean warm free minute strong special
mind behind clear tail produce fact street inch multiply nothing course stay wheel
full force blue object decide surface deep moon island foot system busy test record
boat common gold possible plane stead dry wonder laugh thousand ago ran check game
shape equate hot miss brought heat snow tire bring yes distant fill east paint
language among database search query index vector document passage tenant account
invoice payment refund policy password reset login error server request response
customer support ticket order shipping delivery price product warranty return
postgres rerank model score token embedding retrieval hybrid ranking relevant
""".split()

_VI_SYLLABLES = """
xin chào tôi bạn anh chị em ông bà cô chú họ chúng ta mình của và là có không được những các
một hai ba bốn năm sáu bảy tám chín mười trăm nghìn triệu người nhà nước việt nam
hà nội sài gòn thành phố đường số điện thoại tiền thanh toán hóa đơn tài khoản mật
khẩu đăng nhập lỗi hệ thống máy chủ dữ liệu tìm kiếm câu hỏi trả lời hỗ trợ khách
hàng đơn giao nhận hoàn sản phẩm giá bảo hành chính sách công ty dịch vụ ngày tháng
giờ phút tuần sáng chiều tối hôm nay mai qua đi đến về ra vào lên xuống làm học ăn
uống ngủ nói viết đọc nghe xem biết hiểu muốn cần phải nên sẽ đã đang rất nhiều ít
lớn nhỏ mới cũ tốt xấu đẹp nhanh chậm cao thấp dài ngắn trong ngoài trên dưới trước
sau với cho từ theo như khi nếu thì mà vì nên để bằng cùng cũng chỉ còn đều lại nữa
gì ai đâu nào sao bao thế này kia đó ấy đây vậy ạ nhé chưa xin cảm ơn vui lòng
quý kính gửi thông tin chi tiết yêu cầu xử lý kết quả vấn đề giải pháp hướng dẫn
cách sử dụng cài đặt cập nhật phiên bản ứng dụng trang web điện tử thư liên hệ
""".split()


def _dedupe(items):
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def build_vocab() -> list[str]:
    """The WordPiece vocabulary, in id order (deterministic)."""
    chars = list(_ASCII) + list(_PUNCT) + list(_VI_LETTERS)
    words = [unicodedata.normalize("NFC", w) for w in _EN_WORDS + _VI_SYLLABLES]
    return _dedupe(
        list(SPECIAL_TOKENS)
        + chars
        + ["##" + c for c in list(_ASCII) + list(_VI_LETTERS)]
        + words
    )


def sample_words() -> list[str]:
    """Words that the builders' tokenizer encodes as exactly one token each."""
    vocab = set(build_vocab())
    words = [unicodedata.normalize("NFC", w) for w in _EN_WORDS + _VI_SYLLABLES]
    return [w for w in _dedupe(words) if w in vocab]


def _build_tokenizer(model_max_length: int, style: str = "xlm-roberta"):
    """The offline WordPiece tokenizer. ``style="xlm-roberta"``: pairs as ``<s> A </s></s> B </s>``,
    no token type ids (XLM-RoBERTa's); ``"bert"``: ``<s> A </s> B </s>`` with token type ids 0/1
    (BERT's and DeBERTa-v2's ``[CLS] A [SEP] B [SEP]``, with this vocabulary's special tokens)."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import BertTokenizerFast, XLMRobertaTokenizerFast

    vocab = {tok: i for i, tok in enumerate(build_vocab())}
    tok = Tokenizer(WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix="##",
                              max_input_chars_per_word=100))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>" if style == "xlm-roberta" else "<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])],
    )
    tok.decoder = decoders.WordPiece(prefix="##")
    if style == "bert":
        return BertTokenizerFast(
            tokenizer_object=tok,
            cls_token="<s>",
            sep_token="</s>",
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
            model_max_length=model_max_length,
        )
    if style != "xlm-roberta":
        raise ValueError(f"unknown tokenizer style {style!r}")
    return XLMRobertaTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=model_max_length,
    )


def _model_class(config):
    """The ``...ForSequenceClassification`` class of ``config``'s architecture (transformers' own)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    return MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]


def _write(path: Path, config, seed: int, *, model_max_length: int | None = None,
           tokenizer_style: str = "xlm-roberta") -> Path:
    import torch

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(config)(config)
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer = _build_tokenizer(model_max_length=model_max_length or config.max_position_embeddings - 2,
                                 style=tokenizer_style)
    tokenizer.save_pretrained(path)
    return path


def build_tiny_cross_encoder(path: Path, *, seed: int = 0) -> Path:
    """Write a tiny random XLM-R cross-encoder (num_labels=1) + tokenizer to ``path``.

    hidden 32, 2 layers, 2 heads, intermediate 64, ~1k-token WordPiece vocab,
    max 514 positions (512 tokens).  Entirely offline and deterministic for a
    given ``seed`` (weights are initialised under a forked torch RNG, so the
    caller's global RNG state is left untouched).  ``initializer_range`` is
    larger than usual so that different passages get clearly different scores.
    Returns ``path``.
    """
    from transformers import XLMRobertaConfig

    config = XLMRobertaConfig(
        vocab_size=len(build_vocab()),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        layer_norm_eps=1e-5,
        initializer_range=0.5,
        num_labels=1,
    )
    return _write(path, config, seed)


def build_random_bge_reranker_v2_m3(path: Path, *, seed: int = 0) -> Path:
    """Write a randomly initialised model with bge-reranker-v2-m3's architecture.

    XLMRobertaForSequenceClassification: 24 layers, hidden 1024, 16 heads,
    intermediate 4096, vocab 250002, max_position_embeddings 8194, num_labels 1
    (~568M parameters, ~2.3 GB as fp32 safetensors).  Its scores are
    meaningless, but the compute cost of a forward pass depends only on the
    architecture and the (padded) sequence lengths, not on the weight values,
    so it is a faithful stand-in for latency/throughput measurements when the
    real checkpoint cannot be downloaded.

    The tokenizer is the offline WordPiece one of the tiny model (ids all fall
    inside the 250002-row embedding).  Words from :func:`sample_words` are one
    token each, other words split into sub-words/characters, so text built from
    those words produces realistic, controllable sequence lengths; the real
    SentencePiece tokenizer would give somewhat different lengths for the same
    text, which is why benchmarks should report measured token counts.
    Takes tens of seconds and ~2.3 GB of disk; don't call it from unit tests.
    """
    return _write(path, cross_encoder_config("BAAI/bge-reranker-v2-m3"), seed)


# ------------------------------------------------------------------ published architectures
class ArchitectureUnavailable(ValueError):
    """The architecture cannot be built offline from transformers' own classes."""


# The cross-encoders users pick, as published. Each entry's ``config`` holds the values of the
# model's ``config.json`` on the Hugging Face hub (https://huggingface.co/<id>/blob/main/config.json)
# that fix the architecture, and so the cost of a forward pass. Those files could not be read from
# here (no hub access; the search index holds no copy of them), so the values are the well-known
# ones of each family (BERT MiniLM-L12-H384, XLM-RoBERTa base and large, DeBERTa-v3-xsmall, whose
# sizes keras-hub's DeBERTa-v3 presets also list: 128100 / 12 / 6 / 384 / 1536 / 512 positions /
# 256 buckets), checked against each model's published parameter count (``published_params``: the
# hub page's count, 278M for bge-reranker-base also on its third-party listings, and mixedbread's
# "Parameters 70M" at https://www.mixedbread.com/docs/reranking/models/mxbai-rerank-xsmall-v1;
# tests/models/test_model_fit.py holds the built models to 2% of them). ``tokenizer``: how the offline
# WordPiece tokenizer frames a pair (_build_tokenizer); its ~1k ids fall inside every vocabulary.
CROSS_ENCODER_ARCHS: dict[str, dict] = {
    "cross-encoder/ms-marco-MiniLM-L-6-v2": {
        "family": "bert",
        "published_params": 22_700_000,  # hub: 22.7M
        "tokenizer": "bert",
        # config.json of cross-encoder/ms-marco-MiniLM-L-6-v2 (BertForSequenceClassification)
        "config": dict(model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                       num_attention_heads=12, intermediate_size=1536, hidden_act="gelu",
                       max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                       pad_token_id=0, position_embedding_type="absolute"),
    },
    "cross-encoder/ms-marco-MiniLM-L-12-v2": {
        "family": "bert",
        "published_params": 33_400_000,  # hub: 33.4M
        "tokenizer": "bert",
        # config.json of cross-encoder/ms-marco-MiniLM-L-12-v2: L-6's with 12 layers (filled in below)
        "config": {"num_hidden_layers": 12},
    },
    "BAAI/bge-reranker-base": {
        "family": "xlm-roberta",
        "published_params": 278_000_000,  # hub: 278M
        "tokenizer": "xlm-roberta",
        # config.json of BAAI/bge-reranker-base (XLMRobertaForSequenceClassification, XLM-R base)
        "config": dict(model_type="xlm-roberta", vocab_size=250002, hidden_size=768, num_hidden_layers=12,
                       num_attention_heads=12, intermediate_size=3072, hidden_act="gelu",
                       max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5,
                       pad_token_id=1, bos_token_id=0, eos_token_id=2, position_embedding_type="absolute"),
    },
    "mixedbread-ai/mxbai-rerank-xsmall-v1": {
        "family": "deberta-v2",
        "published_params": 70_800_000,  # hub: 70.8M; mixedbread's model page: 70M
        "tokenizer": "bert",  # DeBERTa-v2 frames pairs as [CLS] A [SEP] B [SEP]
        # config.json of mixedbread-ai/mxbai-rerank-xsmall-v1 (DebertaV2ForSequenceClassification,
        # DeBERTa-v3-xsmall: 12 layers of 384, 6 heads, relative attention in 256 log buckets)
        "config": dict(model_type="deberta-v2", vocab_size=128100, hidden_size=384, num_hidden_layers=12,
                       num_attention_heads=6, intermediate_size=1536, hidden_act="gelu",
                       max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7,
                       relative_attention=True, max_relative_positions=-1, position_buckets=256,
                       norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                       position_biased_input=False, pooler_hidden_size=384, pooler_hidden_act="gelu",
                       pooler_dropout=0, pad_token_id=0),
    },
    "jinaai/jina-reranker-v2-base-multilingual": {
        "family": "jina (custom code)",
        "published_params": 278_000_000,  # hub: 278M
        "unavailable": (
            "its config.json maps the model to custom modelling code on the hub (auto_map, loaded with "
            "trust_remote_code=True: a flash-attention implementation Jina publishes separately), not to a "
            "class of transformers; that code cannot be downloaded here, and another architecture in its "
            "place would not measure this model"),
    },
    "BAAI/bge-reranker-v2-m3": {
        "family": "xlm-roberta",
        "published_params": 568_000_000,  # hub: 568M
        "tokenizer": "xlm-roberta",
        # config.json of BAAI/bge-reranker-v2-m3 (XLM-R large, 8194 positions): the existing builder's
        "config": dict(model_type="xlm-roberta", vocab_size=250002, hidden_size=1024, num_hidden_layers=24,
                       num_attention_heads=16, intermediate_size=4096, hidden_act="gelu",
                       max_position_embeddings=8194, type_vocab_size=1, layer_norm_eps=1e-5,
                       pad_token_id=1, bos_token_id=0, eos_token_id=2, position_embedding_type="absolute"),
    },
}


CROSS_ENCODER_ARCHS["cross-encoder/ms-marco-MiniLM-L-12-v2"]["config"] = {
    **CROSS_ENCODER_ARCHS["cross-encoder/ms-marco-MiniLM-L-6-v2"]["config"], "num_hidden_layers": 12}


def cross_encoder_config(arch_name: str):
    """The transformers config of ``arch_name`` (a key of :data:`CROSS_ENCODER_ARCHS`), num_labels=1.
    Raises ``ArchitectureUnavailable`` for an architecture transformers cannot build, ``KeyError``
    for an unknown name."""
    from transformers import AutoConfig

    entry = CROSS_ENCODER_ARCHS[arch_name]
    if "unavailable" in entry:
        raise ArchitectureUnavailable(f"{arch_name}: {entry['unavailable']}")
    values = dict(entry["config"])
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, num_labels=1, initializer_range=0.02,
                                hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, **values)


def build_random_cross_encoder(path: Path, arch_name: str, *, seed: int = 0) -> Path:
    """Write a randomly initialised cross-encoder with the published architecture of ``arch_name``
    (a key of :data:`CROSS_ENCODER_ARCHS`) and the offline tokenizer to ``path``; returns ``path``.

    As :func:`build_random_bge_reranker_v2_m3`: the scores mean nothing, the cost of a forward pass
    is the real model's (it depends on the architecture and the sequence lengths, not on the
    weights). The tokenizer's model_max_length is 512 (every model here reads at most 512 tokens
    in the service). Raises ``ArchitectureUnavailable`` where transformers has no class for it.
    """
    config = cross_encoder_config(arch_name)
    return _write(path, config, seed, model_max_length=512,
                  tokenizer_style=CROSS_ENCODER_ARCHS[arch_name]["tokenizer"])


# ------------------------------------------------------------------ injection models
# The dedicated injection models KB_GUARD_MODEL names (kb_rerank.guard.model), as published: both
# DebertaV2ForSequenceClassification with two labels. The values are the well-known ones of each
# base model (mDeBERTa-v3-base: Prompt Guard 2 86M's, 86M backbone parameters plus a 250k-token
# embedding; DeBERTa-v3-base: the ProtectAI model's), which the hub's config.json files could not
# be read to confirm from here; the cost of a forward pass depends on these sizes, not the weights.
_DEBERTA_V3_BASE = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0, layer_norm_eps=1e-7,
                        relative_attention=True, max_relative_positions=-1, position_buckets=256,
                        norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                        position_biased_input=False, pooler_hidden_size=768, pooler_hidden_act="gelu",
                        pooler_dropout=0, pad_token_id=0)
INJECTION_MODEL_ARCHS: dict[str, dict] = {
    "meta-llama/Llama-Prompt-Guard-2-86M": {"vocab_size": 251000, "labels": ("BENIGN", "MALICIOUS")},
    "protectai/deberta-v3-base-prompt-injection-v2": {"vocab_size": 128100, "labels": ("SAFE", "INJECTION")},
}


def _injection_config(labels: tuple[str, ...], **values):
    from transformers import DebertaV2Config

    return DebertaV2Config(num_labels=len(labels), id2label=dict(enumerate(labels)),
                           label2id={name: i for i, name in enumerate(labels)}, **values)


def build_tiny_injection_model(path: Path, *, seed: int = 0, labels: tuple[str, ...] = ("SAFE", "INJECTION")) -> Path:
    """Write a tiny random DeBERTa-v2 sequence classifier (the architecture of Prompt Guard 2 and
    the ProtectAI injection model: relative attention, two labels named ``labels``) with the
    offline WordPiece tokenizer (BERT framing, as DeBERTa-v2 frames a text) to ``path``: hidden
    32, 2 layers, 2 heads, 512 positions. Deterministic for a given ``seed``; no hub."""
    config = _injection_config(labels, **{**_DEBERTA_V3_BASE, "vocab_size": len(build_vocab()), "hidden_size": 32,
                                          "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                                          "pooler_hidden_size": 32, "initializer_range": 0.5})
    return _write(path, config, seed, model_max_length=512, tokenizer_style="bert")


def build_random_injection_model(path: Path, arch_name: str, *, seed: int = 0) -> Path:
    """Write a randomly initialised injection model with the published architecture of
    ``arch_name`` (a key of :data:`INJECTION_MODEL_ARCHS`) and the offline tokenizer, for cost
    measurements (bench/guard_model_cost.py): its scores mean nothing."""
    entry = INJECTION_MODEL_ARCHS[arch_name]
    config = _injection_config(entry["labels"], **{**_DEBERTA_V3_BASE, "vocab_size": entry["vocab_size"],
                                                   "initializer_range": 0.02})
    return _write(path, config, seed, model_max_length=512, tokenizer_style="bert")
