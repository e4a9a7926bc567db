"""TensorFlow's side of tests/kernels_fused.rs: the numbers stock TensorFlow's own kernels
compute for the fused ops its graph optimizer writes into a master's partitions
(`_FusedMatMul`, `_FusedConv2D`, `_FusedBatchNormEx`), on seeded inputs, printed as one JSON
line.

    python3 tests/kernels_fused_tf.py

Each case is the fused node itself, created in a graph with the attrs a TensorFlow 2.21 master
sends (the fused_ops lists it was seen to send for dense and convolutional models, and the
activations grappler's remapper fuses), run by a local session, so the values are those of
TensorFlow's fused CPU kernels. A case prints its op, attrs, inputs and outputs; the Rust side
builds the same node and runs tessera's kernel on exactly these inputs. `_FusedBatchNormEx`
is run with `Relu` and no side input only, what its masters send: TensorFlow 2.21's CPU kernel
computes no output for `Identity` or a side input ("Missing 0-th output"). Builds without
oneDNN (CPUs without AVX-512) implement fewer fusions: a case they refuse is computed by the
stock ops the fused node stands for and says so (`via`).
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import attr_value_pb2  # noqa: E402

rng = np.random.default_rng(20261126)
ACTIVATIONS = ["Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "GeluApproximate",
               "GeluExact"]


def attr(value):
    """An AttrValue from a Python value (bool, int, float, str, list of int or str, dtype)."""
    if isinstance(value, tf.DType):
        return attr_value_pb2.AttrValue(type=value.as_datatype_enum)
    if isinstance(value, bool):
        return attr_value_pb2.AttrValue(b=value)
    if isinstance(value, int):
        return attr_value_pb2.AttrValue(i=value)
    if isinstance(value, float):
        return attr_value_pb2.AttrValue(f=value)
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    items = list(value)
    if items and isinstance(items[0], tf.DType):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            type=[t.as_datatype_enum for t in items]))
    if items and isinstance(items[0], str):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
            s=[s.encode() for s in items]))
    return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(i=items))


def json_attr(value):
    """The attr as the Rust side reads it: {"kind": value}."""
    if isinstance(value, tf.DType):
        return {"type": value.name}
    if isinstance(value, bool):
        return {"b": value}
    if isinstance(value, int):
        return {"i": value}
    if isinstance(value, float):
        return {"f": value}
    if isinstance(value, str):
        return {"s": value}
    items = list(value)
    if items and isinstance(items[0], tf.DType):
        return {"types": [t.name for t in items]}
    if items and isinstance(items[0], str):
        return {"strings": items}
    return {"ints": items}


def activate(y, name, attrs):
    """One of ACTIVATIONS applied by its stock op."""
    return {
        "Relu": tf.nn.relu, "Relu6": tf.nn.relu6, "Elu": tf.nn.elu, "Tanh": tf.tanh,
        "Sigmoid": tf.sigmoid,
        "LeakyRelu": lambda t: tf.nn.leaky_relu(t, alpha=attrs.get("leakyrelu_alpha", 0.2)),
        "GeluApproximate": lambda t: tf.nn.gelu(t, approximate=True),
        "GeluExact": lambda t: tf.nn.gelu(t, approximate=False),
    }[name](y)


def unfused(op, consts, attrs):
    """The fused node's outputs from the stock ops it stands for. TensorFlow builds without
    oneDNN (a CPU without AVX-512) implement `_FusedMatMul` for a few activations only and
    compute no output for `_FusedBatchNormEx`."""
    if op == "_FusedMatMul":
        a, b, bias = consts
        y = tf.nn.bias_add(tf.linalg.matmul(a, b, transpose_a=attrs["transpose_a"],
                                            transpose_b=attrs["transpose_b"]), bias)
        for name in attrs["fused_ops"][1:]:
            y = activate(y, name, attrs)
        return [y]
    if op == "_FusedBatchNormEx":
        outs = list(tf.raw_ops.FusedBatchNormV3(
            x=consts[0], scale=consts[1], offset=consts[2], mean=consts[3],
            variance=consts[4], epsilon=attrs["epsilon"], is_training=attrs["is_training"]))
        outs[0] = activate(outs[0], attrs["activation_mode"], attrs)
        return outs
    raise ValueError(f"no unfused form of {op}")


def run(op, inputs, attrs, n_out, what):
    """Runs one fused node in a fresh graph, or where this build of TensorFlow does not
    implement it, the stock ops it stands for; returns the case."""
    via = "fused"
    try:
        outs = run_graph(lambda consts: op_outputs(op, consts, attrs, n_out), inputs)
    except tf.errors.OpError as e:
        if "Fusion is not implemented" not in str(e) and "Missing" not in str(e):
            raise
        via = "unfused"
        outs = run_graph(lambda consts: unfused(op, consts, attrs), inputs)
    return {
        "what": what,
        "via": via,
        "op": op,
        "attrs": {k: json_attr(v) for k, v in attrs.items()},
        "inputs": [{"shape": list(x.shape), "values": x.astype(np.float64).ravel().tolist()}
                   for x in inputs],
        # y and the batch statistics; the reserve spaces (outputs 3 to 5 of batch
        # normalization) are each runtime's own layout, may be uninitialized (stray NaNs,
        # which JSON cannot carry), and are printed by shape only.
        "outputs": [{"shape": list(o.shape),
                     "values": o.astype(np.float64).ravel().tolist() if i < 3 else []}
                    for i, o in enumerate(outs)],
    }


def op_outputs(op, consts, attrs, n_out):
    node = tf.compat.v1.get_default_graph()._create_op_internal(
        op, consts, dtypes=[tf.float32] * n_out,
        attrs={k: attr(v) for k, v in attrs.items()}, name="fused")
    return node.outputs


def run_graph(build, inputs):
    """The outputs `build` makes of `inputs`, fed to placeholders (constants would be folded
    away by grappler), run by a local session."""
    g = tf.Graph()
    with g.as_default():
        feeds = [tf.compat.v1.placeholder(tf.float32, x.shape) for x in inputs]
        outputs = build(feeds)
        with tf.compat.v1.Session(graph=g) as s:
            return s.run(outputs, feed_dict=dict(zip(feeds, inputs)))


def uniform(*shape):
    return rng.uniform(-1.5, 1.5, shape).astype(np.float32)


def matmul_cases():
    cases = []
    for fused in [["BiasAdd"]] + [["BiasAdd", a] for a in ACTIVATIONS]:
        for ta, tb in [(False, False), (True, False), (False, True)]:
            if fused != ["BiasAdd", "Relu"] and (ta or tb):
                continue
            m, k, n = 5, 7, 6
            a = uniform(*((k, m) if ta else (m, k)))
            b = uniform(*((n, k) if tb else (k, n)))
            bias = uniform(n)
            attrs = {"T": tf.float32, "num_args": 1, "fused_ops": fused, "epsilon": 0.0,
                     "transpose_a": ta, "transpose_b": tb}
            if "LeakyRelu" in fused:
                attrs["leakyrelu_alpha"] = 0.1
            cases.append(run("_FusedMatMul", [a, b, bias], attrs, 1,
                             f"_FusedMatMul {fused} transpose_a {ta} transpose_b {tb}"))
    return cases


def conv_cases():
    cases = []
    geometries = [("SAME", [1, 1, 1, 1]), ("VALID", [1, 2, 2, 1])]
    for first in ["BiasAdd", "FusedBatchNorm"]:
        for act in [None, "Relu", "Relu6", "Elu", "LeakyRelu"]:
            for padding, strides in geometries:
                fused = [first] + ([act] if act else [])
                x = uniform(2, 7, 6, 3)
                f = uniform(3, 3, 3, 4)
                if first == "BiasAdd":
                    args = [uniform(4)]
                    eps = 0.0
                else:
                    args = [uniform(4), uniform(4), uniform(4),
                            rng.uniform(0.2, 2.0, 4).astype(np.float32)]
                    eps = 0.001
                attrs = {"T": tf.float32, "TArgs": [tf.float32] * len(args),
                         "num_args": len(args), "num_host_args": 0, "fused_ops": fused,
                         "epsilon": eps,
                         "strides": strides, "padding": padding}
                if act == "LeakyRelu":
                    attrs["leakyrelu_alpha"] = 0.1
                cases.append(run("_FusedConv2D", [x, f, *args], attrs, 1,
                                 f"_FusedConv2D {fused} {padding} strides {strides}"))
    return cases


def batch_norm_cases():
    cases = []
    for training in [True, False]:
        for act in ["Relu"]:
            x = uniform(2, 5, 3, 8)
            scale, offset = uniform(8), uniform(8)
            mean, var = uniform(8), rng.uniform(0.2, 2.0, 8).astype(np.float32)
            attrs = {"T": tf.float32, "U": tf.float32, "activation_mode": act,
                     "epsilon": 0.001, "is_training": training, "num_side_inputs": 0}
            cases.append(run("_FusedBatchNormEx", [x, scale, offset, mean, var], attrs, 6,
                             f"_FusedBatchNormEx {act} is_training {training}"))
    return cases


print(json.dumps({"matmul": matmul_cases(), "conv": conv_cases(),
                  "batch_norm": batch_norm_cases()}))
