"""Op classes of the GPU cost model: every captured ``op_type`` maps to one class (``op_class``).

GEMM-like classes (linear, bmm, conv) are priced by the tile / wave model, memory-bound classes by bytes over
bandwidth, views cost nothing (``placement_rl.cost.calibrated``).
"""

from __future__ import annotations

CLASSES = ("view", "linear", "bmm", "conv", "norm", "softmax", "ew", "ew_pass", "embedding", "loss", "pool")
GEMM_CLASSES = ("linear", "bmm", "conv")
MEM_CLASSES = ("norm", "softmax", "ew", "ew_pass", "embedding", "loss", "pool")

_VIEW = {"view", "reshape", "_reshape_alias", "transpose", "permute", "unsqueeze", "squeeze", "expand", "alias",
         "split", "split_with_sizes", "slice", "select", "t", "detach", "size", "getitem", "getattr", "flatten",
         "chunk", "unbind", "unflatten", "view_as", "expand_as", "to", "type", "type_as", "long", "bool", "float",
         "contiguous_view", "input", "placeholder", "output", "get_attr", "dim", "finfo", "numel", "lift_fresh_copy",
         "_assert_tensor_metadata", "_assert_scalar", "sym_size", "_unsafe_view", "movedim", "as_strided", "identity",
         "dropout_eval", "setitem", "masked_fill_", "zero_", "new_zeros", "tensor", "scalar_tensor", "numpy_t", "mt",
         "mh", "adjoint", "swapaxes", "swapdims"}
_LINEAR = {"linear", "addmm", "mm", "matmul_param", "conv1d_hf"}
_BMM = {"bmm", "baddbmm", "matmul", "einsum", "scaled_dot_product_attention"}
_CONV = {"conv", "conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution",
         "conv_transpose2d"}
_NORM = {"layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
         "_native_batch_norm_legit_no_training", "group_norm", "native_group_norm", "instance_norm", "rms_norm",
         "local_response_norm", "lrn"}
_SOFTMAX = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_EMBED = {"embedding", "embedding_bag"}
_LOSS = {"cross_entropy_loss", "cross_entropy", "nll_loss", "nll_loss_nd", "nll_loss_forward", "mse_loss",
         "l1_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "smooth_l1_loss"}
_POOL = {"max_pool1d", "max_pool2d", "max_pool3d", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
         "adaptive_avg_pool2d", "adaptive_max_pool2d", "max_pool2d_with_indices", "mean", "sum"}
# element-wise ops whose backward is a pass-through (no kernel) or a view
_EW_PASS = {"add", "add_", "sub", "rsub", "neg", "iadd", "cat", "concat", "stack", "pad", "constant_pad_nd",
            "clone", "contiguous", "copy", "copy_", "repeat"}


def base_name(op_type: str) -> str:
    """The op's name as the class tables list it: the last dotted part, lower case, without ``_default``
    (``aten.addmm.default`` -> ``addmm``, ``numpy_T`` -> ``numpy_t``)."""
    return op_type.rsplit(".", 1)[-1].lower().removesuffix("_default")


def op_class(op_type: str, param_bytes: float = 0.0, flops: float = 0.0) -> str:
    """The cost class of an op type (``aten``-style name as captured, e.g. ``addmm``, ``layer_norm``).

    An unknown op type (hand-written or synthetic graphs) that carries FLOPs is priced as a GEMM
    (``linear``); without FLOPs it is element-wise."""
    name = base_name(op_type)
    if name in _VIEW or name.startswith("_assert"):
        return "view"
    if name in _BMM:
        return "linear" if (name == "matmul" and param_bytes > 0) else "bmm"
    for cls, names in (("linear", _LINEAR), ("conv", _CONV), ("norm", _NORM), ("softmax", _SOFTMAX),
                       ("embedding", _EMBED), ("loss", _LOSS), ("pool", _POOL), ("ew_pass", _EW_PASS)):
        if name in names:
            return cls
    if "conv" in name:
        return "conv"
    if "pool" in name:
        return "pool"
    if "norm" in name:
        return "norm"
    return "linear" if flops > 0 else "ew"
