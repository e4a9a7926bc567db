"""TensorFlow's side of tests/kernels_sparse_apply.rs: every sparse optimizer update, in both
forms (SparseApplyX on reference variables, ResourceSparseApplyX on resource variables), run by
stock TensorFlow for three steps on seeded inputs whose indices repeat and are out of order, and
printed with those inputs as one JSON line. Also the dense ApplyAdagradDA / ResourceApplyAdagradDA,
whose rule the sparse AdagradDA shares.

    python3 tests/kernels_sparse_apply_tf.py [kernels]
    python3 tests/kernels_sparse_apply_tf.py cluster --ps HOST:PORT --worker HOST:PORT

Float32 values are printed exactly (as float64), so the Rust side runs on the very inputs
TensorFlow ran on. `cluster` instead runs every sparse update in both forms as a TensorFlow 1
client of a cluster (the variables and the updates on the ps, colocated as TensorFlow's
optimizers colocate them) and in its own process, and prints both results.
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261126)

# Per rule: slots with the range their initial values are drawn from, and variants of
# (hyper-parameters, attrs). Ranges keep square roots and denominators positive.
RULES = {
    "ProximalGradientDescent": ([], [
        (dict(alpha=0.1, l1=0.05, l2=0.2), {}),
        (dict(alpha=0.1, l1=0.0, l2=0.2), {}),
    ]),
    "Adadelta": ([("accum", 0.0, 0.5), ("accum_update", 0.0, 0.5)], [
        (dict(lr=1.0, rho=0.95, epsilon=0.1), {}),
    ]),
    "Adagrad": ([("accum", 0.1, 1.0)], [
        (dict(lr=0.1), {}),
        (dict(lr=0.1), dict(update_slots=False)),
    ]),
    "AdagradV2": ([("accum", 0.1, 1.0)], [
        (dict(lr=0.1, epsilon=0.01), {}),
        (dict(lr=0.1, epsilon=0.01), dict(update_slots=False)),
    ]),
    "AdagradDA": ([("gradient_accumulator", -0.5, 0.5), ("gradient_squared_accumulator", 0.1, 1.0)], [
        (dict(lr=0.1, l1=0.05, l2=0.2, global_step=3), {}),
        (dict(lr=0.1, l1=0.0, l2=0.2, global_step=3), {}),
    ]),
    "ProximalAdagrad": ([("accum", 0.1, 1.0)], [
        (dict(lr=0.1, l1=0.05, l2=0.2), {}),
        (dict(lr=0.1, l1=0.0, l2=0.2), {}),
    ]),
    "Ftrl": ([("accum", 0.1, 1.0), ("linear", -0.5, 0.5)], [
        (dict(lr=0.5, l1=0.1, l2=0.2, lr_power=-0.5), {}),
        (dict(lr=0.5, l1=0.1, l2=0.2, lr_power=-0.7), {}),
        (dict(lr=0.5, l1=0.1, l2=0.2, lr_power=-0.5), dict(multiply_linear_by_lr=True)),
    ]),
    "FtrlV2": ([("accum", 0.1, 1.0), ("linear", -0.5, 0.5)], [
        (dict(lr=0.5, l1=0.1, l2=0.2, l2_shrinkage=0.1, lr_power=-0.5), {}),
        (dict(lr=0.5, l1=0.1, l2=0.2, l2_shrinkage=0.1, lr_power=-0.7), {}),
        (dict(lr=0.5, l1=0.1, l2=0.2, l2_shrinkage=0.1, lr_power=-0.5),
         dict(multiply_linear_by_lr=True)),
    ]),
    "Momentum": ([("accum", -0.1, 0.1)], [
        (dict(lr=0.1, momentum=0.9), {}),
        (dict(lr=0.1, momentum=0.9), dict(use_nesterov=True)),
    ]),
    "RMSProp": ([("ms", 0.5, 1.0), ("mom", -0.1, 0.1)], [
        (dict(lr=0.01, rho=0.9, momentum=0.5, epsilon=1e-3), {}),
    ]),
    "CenteredRMSProp": ([("mg", -0.1, 0.1), ("ms", 0.5, 1.0), ("mom", -0.1, 0.1)], [
        (dict(lr=0.01, rho=0.9, momentum=0.5, epsilon=1e-3), {}),
    ]),
}

# Three steps; indices repeat and are unsorted, and the third has more than the rows a sparse
# update prefetches ahead. The 1-D variables take TensorFlow's scalar path.
STEP_INDICES = [[3, 0, 3, 1], [4, 1, 4, 4, 0], [2, 0, 4, 1, 3, 3, 0, 2, 4, 1, 0, 2]]
SHAPES = [[5, 3], [6], [5, 2, 2]]


def flat(a):
    return np.asarray(a, dtype=np.float64).ravel().tolist()


def run_sparse(rule, slots, params, attrs, shape, dtype, index_dtype):
    np_dtype = dtype.as_numpy_dtype
    var0 = rng.uniform(-1, 1, shape).astype(np_dtype)
    slots0 = [rng.uniform(lo, hi, shape).astype(np_dtype) for _, lo, hi in slots]
    steps = []
    for indices in STEP_INDICES:
        grad = rng.uniform(-1, 1, [len(indices)] + shape[1:]).astype(np_dtype)
        steps.append((np.asarray(indices, index_dtype.as_numpy_dtype), grad))

    results = {}
    for form in ("ref", "resource"):
        g = tf.Graph()
        with g.as_default():
            use_resource = form == "resource"
            var = tf.compat.v1.Variable(var0, use_resource=use_resource, name="var")
            slot_vars = [tf.compat.v1.Variable(v, use_resource=use_resource, name=n)
                         for (n, _, _), v in zip(slots, slots0)]
            grad_ph = tf.compat.v1.placeholder(dtype, [None] + shape[1:])
            indices_ph = tf.compat.v1.placeholder(index_dtype, [None])
            kwargs = {}
            for name, value in params.items():
                kwargs[name] = tf.constant(value, tf.int64 if name == "global_step" else dtype)
            kwargs.update(attrs)
            kwargs.update(grad=grad_ph, indices=indices_ph)
            targets = [var] + slot_vars
            names = ["var"] + [n for n, _, _ in slots]
            for name, v in zip(names, targets):
                kwargs[name] = v.handle if use_resource else v
            op = ("ResourceSparseApply" if use_resource else "SparseApply") + rule
            update = getattr(tf.raw_ops, op)(**kwargs)
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for indices, grad in steps:
                    sess.run(update, {grad_ph: grad, indices_ph: indices})
                results[form] = [flat(sess.run(v)) for v in targets]
    return dict(
        rule=rule, sparse=True, attrs=attrs, dtype=dtype.name, index_dtype=index_dtype.name,
        shape=shape, params={k: float(v) for k, v in params.items()},
        start=[flat(var0)] + [flat(s) for s in slots0],
        slots=[n for n, _, _ in slots],
        steps=[dict(indices=i.tolist(), grad=flat(gr)) for i, gr in steps],
        ref=results["ref"], resource=results["resource"])


def run_dense_adagrad_da(dtype, shape):
    """ApplyAdagradDA / ResourceApplyAdagradDA, two steps of dense gradients."""
    np_dtype = dtype.as_numpy_dtype
    var0 = rng.uniform(-1, 1, shape).astype(np_dtype)
    ga0 = rng.uniform(-0.5, 0.5, shape).astype(np_dtype)
    gsa0 = rng.uniform(0.1, 1.0, shape).astype(np_dtype)
    grads = [rng.uniform(-1, 1, shape).astype(np_dtype) for _ in range(2)]
    params = dict(lr=0.1, l1=0.05, l2=0.2, global_step=3)
    results = {}
    for form in ("ref", "resource"):
        g = tf.Graph()
        with g.as_default():
            use_resource = form == "resource"
            targets = [tf.compat.v1.Variable(v, use_resource=use_resource)
                       for v in (var0, ga0, gsa0)]
            grad_ph = tf.compat.v1.placeholder(dtype, shape)
            handles = [t.handle if use_resource else t for t in targets]
            op = "ResourceApplyAdagradDA" if use_resource else "ApplyAdagradDA"
            update = getattr(tf.raw_ops, op)(
                var=handles[0], gradient_accumulator=handles[1],
                gradient_squared_accumulator=handles[2], grad=grad_ph,
                lr=tf.constant(params["lr"], dtype), l1=tf.constant(params["l1"], dtype),
                l2=tf.constant(params["l2"], dtype),
                global_step=tf.constant(params["global_step"], tf.int64))
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for grad in grads:
                    sess.run(update, {grad_ph: grad})
                results[form] = [flat(sess.run(v)) for v in targets]
    return dict(
        rule="AdagradDA", sparse=False, attrs={}, dtype=dtype.name, index_dtype=None,
        shape=shape, params={k: float(v) for k, v in params.items()},
        start=[flat(var0), flat(ga0), flat(gsa0)],
        slots=["gradient_accumulator", "gradient_squared_accumulator"],
        steps=[dict(indices=None, grad=flat(gr)) for gr in grads],
        ref=results["ref"], resource=results["resource"])


def cluster_case(rule, slots, params, attrs, use_resource, target, spec):
    """One sparse update, three steps, with the variables on the ps: in TensorFlow alone
    (`target` None) or through the session at `target`. Returns the values after the steps."""
    shape, dtype = [5, 3], tf.float32
    seeded = np.random.default_rng(len(rule) * 7 + len(slots) + int(use_resource))
    var0 = seeded.uniform(-1, 1, shape).astype(np.float32)
    slots0 = [seeded.uniform(lo, hi, shape).astype(np.float32) for _, lo, hi in slots]
    steps = [(np.asarray(i, np.int64), seeded.uniform(-1, 1, [len(i), 3]).astype(np.float32))
             for i in STEP_INDICES]
    setter = None
    if target is not None:
        setter = tf.compat.v1.train.replica_device_setter(
            cluster=spec, worker_device="/job:worker/task:0")
    g = tf.Graph()
    with g.as_default(), tf.compat.v1.device(setter):
        targets = [tf.compat.v1.Variable(var0, use_resource=use_resource, name="var")]
        targets += [tf.compat.v1.Variable(v, use_resource=use_resource, name=n)
                    for (n, _, _), v in zip(slots, slots0)]
        grad_ph = tf.compat.v1.placeholder(dtype, [None, 3])
        indices_ph = tf.compat.v1.placeholder(tf.int64, [None])
        with tf.compat.v1.colocate_with(targets[0]):
            kwargs = {name: tf.constant(value, tf.int64 if name == "global_step" else dtype)
                      for name, value in params.items()}
            kwargs.update(attrs)
            kwargs.update(grad=grad_ph, indices=indices_ph)
            for name, v in zip(["var"] + [n for n, _, _ in slots], targets):
                kwargs[name] = v.handle if use_resource else v
            op = ("ResourceSparseApply" if use_resource else "SparseApply") + rule
            update = getattr(tf.raw_ops, op)(**kwargs)
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(cluster_def=spec.as_cluster_def()) if target else None
    with tf.compat.v1.Session(target or "", graph=g, config=config) as sess:
        sess.run(init)
        for indices, grad in steps:
            sess.run(update, {grad_ph: grad, indices_ph: indices})
        return [flat(sess.run(v)) for v in targets], [v.device for v in targets]


def cluster(args):
    tf.compat.v1.disable_eager_execution()
    spec = tf.train.ClusterSpec({"ps": [args.ps], "worker": [args.worker]})
    cases = []
    for rule, (slots, variants) in RULES.items():
        params, attrs = variants[0]
        for use_resource in (False, True):
            local, _ = cluster_case(rule, slots, params, attrs, use_resource, None, spec)
            remote, devices = cluster_case(rule, slots, params, attrs, use_resource,
                                           "grpc://" + args.worker, spec)
            op = ("ResourceSparseApply" if use_resource else "SparseApply") + rule
            cases.append(dict(op=op, local=local, remote=remote, devices=devices))
    print(json.dumps(dict(tensorflow=tf.__version__, cases=cases)))


def kernels():
    cases = []
    k = 0
    for rule, (slots, variants) in RULES.items():
        for params, attrs in variants:
            for shape in SHAPES:
                for dtype in (tf.float32, tf.float64):
                    index_dtype = (tf.int32, tf.int64)[k % 2]
                    k += 1
                    cases.append(run_sparse(rule, slots, params, attrs, shape, dtype,
                                            index_dtype))
    for dtype in (tf.float32, tf.float64):
        cases.append(run_dense_adagrad_da(dtype, [4, 3]))
    print(json.dumps(dict(tensorflow=tf.__version__, cases=cases)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("kernels")
    on_cluster = commands.add_parser("cluster")
    on_cluster.add_argument("--ps", required=True)
    on_cluster.add_argument("--worker", required=True)
    args = parser.parse_args()
    if args.command == "cluster":
        cluster(args)
    else:
        kernels()


if __name__ == "__main__":
    main()
