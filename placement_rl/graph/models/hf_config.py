"""Reading a Hugging Face ``transformers`` config for ``graph.source=hf`` (``hf_auto`` builds the model from it).

The config comes from a ``config.json`` (or a folder holding one, as ``save_pretrained`` writes it) or, when no
file is given, from a ``model_type`` with the library's defaults; ``overrides`` set config fields (each must be
one the config has). A composite (multimodal) config keeps its language model in ``text_config``: a field the
top level lacks but ``text_config`` has (``num_hidden_layers`` of gemma3, llama4 ...) is set there, and a mapping
value (``overrides={"vision_config": {"num_hidden_layers": 2}}``) sets fields of that sub-config. Per-layer lists
(``layer_types`` ...) follow a changed layer count. ``check_sizes`` refuses, in one line, sizes the model's code
would only fail on inside a capture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from placement_rl.errors import GraphError


def transformers_module():
    try:
        import transformers
    except ImportError:
        raise GraphError("graph.source=hf needs the 'transformers' package: pip install 'placement-rl[hf]'") from None
    transformers.logging.set_verbosity_error()  # config sanity chatter (token ids outside a shrunk vocabulary)
    return transformers


def load_config(config: str | None, model_type: str | None, overrides: Mapping[str, Any] | None):
    """The ``PretrainedConfig`` from a config.json / folder or a model type, with ``overrides`` applied. The
    config is constructed with them (fields derived at construction, such as a head size from the hidden size,
    follow); each must be a field the config has."""
    tf = transformers_module()
    data: dict[str, Any] = {}
    if config:
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise GraphError(f"graph.config={config}: no such config.json (give the file or the folder holding it)")
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise GraphError(f"graph.config={config}: not a JSON config ({exc.__class__.__name__})") from None
        if not isinstance(data, dict) or "model_type" not in data:
            raise GraphError(f"graph.config={config}: a transformers config.json names its 'model_type'")
        kind = str(data.pop("model_type"))  # the file names its type: graph.model_type is not used
    elif model_type:
        kind = str(model_type)
    else:
        raise GraphError("graph.source=hf needs graph.config=<config.json> or graph.model_type=<type> (e.g. llama)")
    base = _for_model(tf, kind, data)
    overrides = dict(overrides or {})
    if not overrides:
        return base
    top: dict[str, Any] = {}  # top-level fields
    nested: dict[str, dict[str, Any]] = {}  # sub-config name -> its fields
    text = _text_field(base)
    for key, value in overrides.items():
        sub = get_field(base, key)
        if isinstance(value, Mapping) and is_config(sub):
            for k, v in value.items():
                _check_override(kind, f"{key}.{k}", sub, k, v)
            nested.setdefault(key, {}).update(value)
        elif not has_field(base, key) and text and has_field(get_field(base, text), key):
            _check_override(kind, f"{key}", get_field(base, text), key, value)  # composite config: the text model's
            nested.setdefault(text, {})[key] = value
        else:
            _check_override(kind, key, base, key, value)
            top[key] = value
    subs = {}
    for name, sub_fields in nested.items():
        sub = get_field(base, name)
        sub_data = data.get(name) if isinstance(data.get(name), dict) else _sub_defaults(sub)
        subs[name] = _follow_layers(sub, sub_data, sub_fields, derived=True)
    fields = {**_follow_layers(base, data, top), **subs}
    try:
        return _for_model(tf, kind, fields)
    except GraphError:  # the defaults' per-layer lists (zamba2's layer types) kept the old count: cut them too
        retry = {**_follow_layers(base, data, top, derived=True), **subs}
        if retry == fields:
            raise
        return _for_model(tf, kind, retry)


def get_field(cfg, key: str) -> Any:
    """``cfg.key`` or None: heterogeneous configs (gemma4) raise a RuntimeError for per-layer fields."""
    try:
        return getattr(cfg, key, None)
    except Exception:  # noqa: BLE001
        return None


def has_field(cfg, key: str) -> bool:
    try:
        return hasattr(cfg, key)
    except Exception:  # noqa: BLE001 -- a per-layer field of a heterogeneous config: it is one of its fields
        return True


def is_config(obj: Any) -> bool:
    return hasattr(obj, "to_dict") and hasattr(obj, "to_diff_dict") and hasattr(obj, "model_type")


def _text_field(cfg) -> str | None:
    """The attribute holding a composite config's language model (``text_config``), or None."""
    sub = get_field(cfg, "text_config")
    return "text_config" if is_config(sub) and sub is not cfg else None


def text_config(cfg):
    """The config of the model's text (decoder) side: ``text_config`` of a composite config, else the config."""
    try:
        sub = cfg.get_text_config(decoder=True)
    except Exception:  # noqa: BLE001 -- older transformers, or several text configs (musicgen)
        sub = get_field(cfg, "text_config")
    return sub if is_config(sub) else cfg


def _sub_defaults(sub) -> dict[str, Any]:
    """A default sub-config as constructor fields: those that differ from its class's defaults (a composite config
    may pick its own, as PaliGemma's text model), so that fields derived from the layer count are derived again."""
    try:
        ref = type(sub)().to_dict()
        fields = {k: v for k, v in sub.to_dict().items() if k not in ref or ref[k] != v}
    except Exception:  # noqa: BLE001
        fields = sub.to_diff_dict()
    fields["model_type"] = sub.model_type
    return fields


def _check_override(kind: str, label: str, cfg, key: str, value: Any) -> None:
    if not has_field(cfg, key):
        raise GraphError(f"graph.overrides.{label}: the '{kind}' config has no field '{label}'")
    was = get_field(cfg, key)
    if (isinstance(was, int) and not isinstance(was, bool) and was > 0 and isinstance(value, int)
            and not isinstance(value, bool) and value < 1):  # a count (layers, heads, width ...)
        raise GraphError(f"graph.overrides.{label}={value}: must be >= 1 (the '{kind}' default is {was})")


def _layer_key(cfg) -> str:
    """The field that holds the layer count (``num_layers`` where ``num_hidden_layers`` is its alias)."""
    alias = getattr(cfg, "attribute_map", None) or {}
    return str(alias.get("num_hidden_layers", "num_hidden_layers"))


def _follow_layers(cfg, data: Mapping[str, Any], overrides: Mapping[str, Any], derived: bool = False) -> dict[str, Any]:
    """``{**data, **overrides}`` with per-layer lists (``layer_types`` ...) cut or repeated to a changed layer count:
    the lists of ``data`` (the config file) and, with ``derived``, the lists of layer-type names ``cfg`` holds
    (derived at construction, or fixed defaults such as zamba2's), which would otherwise keep the old count."""
    fields = {**data, **overrides}
    old_layers = get_field(cfg, "num_hidden_layers")
    layers = next((overrides[k] for k in ("num_hidden_layers", _layer_key(cfg)) if k in overrides), None)
    if not (isinstance(old_layers, int) and isinstance(layers, int)) or layers == old_layers:
        return fields
    try:
        defaults = cfg.to_dict() if derived else {}
    except Exception:  # noqa: BLE001
        defaults = {}
    lists = {k: v for k, v in defaults.items() if k not in data and isinstance(v, list) and v
             and all(isinstance(x, str) for x in v)}
    lists.update({k: v for k, v in data.items() if isinstance(v, list)})
    for key, value in lists.items():
        if key not in overrides and len(value) == old_layers:
            fields[key] = (value * (layers // max(old_layers, 1) + 1))[:layers]
    for key, value in data.items():  # {layer index: fields} (gemma4's per_layer_config): the layers that remain
        if key not in overrides and isinstance(value, dict) and value and all(_index(k) >= 0 for k in value):
            if max(_index(k) for k in value) < old_layers:
                fields[key] = {k: v for k, v in value.items() if _index(k) < layers}
    return fields


def _index(key: Any) -> int:
    """A layer index as a JSON key (``"05"``) or an int, else -1."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    return int(key) if isinstance(key, str) and key.isdigit() else -1


def reason(exc: BaseException, limit: int = 200) -> str:
    """One line of an exception: its last non-empty line (validation errors put the cause last)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:limit]


def _for_model(tf, kind: str, kwargs: dict):
    if kind not in tf.models.auto.configuration_auto.CONFIG_MAPPING:
        raise GraphError(f"graph.model_type={kind}: transformers {tf.__version__} knows no such model type "
                         "(e.g. llama, qwen2, mistral, gpt2, bert, t5, vit)")
    try:
        return tf.AutoConfig.for_model(kind, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- the config's own checks (e.g. heads dividing the width)
        raise GraphError(f"the '{kind}' config refuses these fields: {reason(exc)}") from None


def positive_int(value: Any) -> int:
    """``value`` if it is a positive int (not a bool, list or None), else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def attention_sizes(cfg) -> tuple[int, int]:
    """``(query heads, hidden size)`` of a config, 0 where it names none (Swin: one head count per stage)."""
    heads = positive_int(get_field(cfg, "num_attention_heads")) or positive_int(get_field(cfg, "n_head"))
    return heads, positive_int(get_field(cfg, "hidden_size")) or positive_int(get_field(cfg, "n_embd"))


def kv_heads(cfg) -> int:
    """Key-value heads of a config, 0 where it names none: ``num_key_value_heads``, else Falcon's (its
    ``num_kv_heads`` with ``new_decoder_architecture``, one with ``multi_query``, else the query heads)."""
    kv = positive_int(get_field(cfg, "num_key_value_heads"))
    if kv or get_field(cfg, "new_decoder_architecture") is None:
        return kv
    if get_field(cfg, "new_decoder_architecture"):
        return positive_int(get_field(cfg, "num_kv_heads"))
    return 1 if get_field(cfg, "multi_query") else attention_sizes(cfg)[0]


def check_sizes(cfg, model_type: str, seq_len: int | None) -> None:
    """Sizes the model's code would fail on deep inside a capture (a torch traceback, then a shape error), each a
    one-line ``GraphError``: ``seq_len`` (None: no token input) beyond the positions the text side has (a text
    decoder's ``max_target_positions`` for Whisper / Speech2Text), query heads that do not split the hidden size
    (when the config derives the head size from it: no ``head_dim`` / ``d_kv``), or key-value heads that do not
    divide the query heads (grouped-query attention)."""
    field = next((k for k in ("max_position_embeddings", "n_positions", "max_target_positions") if get_field(cfg, k)),
                 "max_position_embeddings")
    limit = get_field(cfg, field)
    if seq_len is not None and isinstance(limit, int) and not isinstance(limit, bool) \
            and 0 < limit < seq_len:  # XLNet says -1: no limit
        raise GraphError(f"graph.seq_len={seq_len} is longer than the config's {limit} positions "
                         f"({field}): lower it or raise that field in graph.overrides")
    heads, hidden = attention_sizes(cfg)
    kv = kv_heads(cfg)
    if heads and hidden and hidden % heads and not any(positive_int(get_field(cfg, k)) for k in ("head_dim", "d_kv")):
        raise GraphError(f"the '{model_type}' config has hidden_size {hidden}, not a multiple of its "
                         f"{heads} attention heads: change one of them in graph.overrides")
    if heads and kv and heads % kv:
        field = "num_key_value_heads" if positive_int(get_field(cfg, "num_key_value_heads")) else "num_kv_heads"
        raise GraphError(f"the '{model_type}' config has {heads} attention heads, not a multiple of its {kv} "
                         f"key-value heads ({field}): change one of them in graph.overrides")


__all__ = ["attention_sizes", "check_sizes", "get_field", "has_field", "is_config", "kv_heads", "load_config",
           "positive_int", "reason", "text_config", "transformers_module"]
