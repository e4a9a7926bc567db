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
computes no output for `Identity` or a side input ("Missing 0-th output").
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


def run(op, inputs, attrs, n_out, what):
    """Runs one fused node in a fresh graph; returns the case."""
    g = tf.Graph()
    with g.as_default():
        consts = [tf.constant(x) for x in inputs]
        node = g._create_op_internal(op, consts, dtypes=[tf.float32] * n_out,
                                     attrs={k: attr(v) for k, v in attrs.items()}, name="fused")
        with tf.compat.v1.Session(graph=g) as s:
            outs = s.run(node.outputs)
    return {
        "what": what,
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
