"""The golden numbers of tests/kernels_ref.rs: runs TensorFlow's optimizer updates on reference
variables (tf.raw_ops.Apply*, in a tf.compat.v1 graph) for three steps on fixed inputs, and a
sequence of Scatter* updates, and prints the values after each step as Rust constants.

    python3 tests/kernels_ref_golden.py   # with TensorFlow installed (2.21 made the constants)
"""
import math
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

VAR0 = [1.0, -2.0, 0.5]
GRADS = [[0.5, -1.5, 2.0], [-0.25, 0.75, 0.0], [1.0, 1.0, -3.0]]

# (case name, op, slot initial values, params per step (function of step k = 1..3), attrs)
B1, B2 = 0.9, 0.999
CASES = [
    ("gradient_descent", "ApplyGradientDescent", [], lambda k: dict(alpha=0.1), {}),
    ("proximal_gradient_descent", "ApplyProximalGradientDescent", [],
     lambda k: dict(alpha=0.1, l1=0.05, l2=0.2), {}),
    ("proximal_gradient_descent_no_l1", "ApplyProximalGradientDescent", [],
     lambda k: dict(alpha=0.1, l1=0.0, l2=0.2), {}),
    ("adagrad", "ApplyAdagrad", [("accum", [0.1, 0.2, 0.3])], lambda k: dict(lr=0.1), {}),
    ("adagrad_frozen_slots", "ApplyAdagrad", [("accum", [0.1, 0.2, 0.3])],
     lambda k: dict(lr=0.1), dict(update_slots=False)),
    ("adagrad_v2", "ApplyAdagradV2", [("accum", [0.1, 0.2, 0.3])],
     lambda k: dict(lr=0.1, epsilon=0.01), {}),
    ("proximal_adagrad", "ApplyProximalAdagrad", [("accum", [0.1, 0.2, 0.3])],
     lambda k: dict(lr=0.1, l1=0.05, l2=0.2), {}),
    ("proximal_adagrad_no_l1", "ApplyProximalAdagrad", [("accum", [0.1, 0.2, 0.3])],
     lambda k: dict(lr=0.1, l1=0.0, l2=0.2), {}),
    ("momentum", "ApplyMomentum", [("accum", [0.0, 0.1, -0.1])],
     lambda k: dict(lr=0.1, momentum=0.9), {}),
    ("momentum_nesterov", "ApplyMomentum", [("accum", [0.0, 0.1, -0.1])],
     lambda k: dict(lr=0.1, momentum=0.9), dict(use_nesterov=True)),
    ("adam", "ApplyAdam", [("m", [0.0] * 3), ("v", [0.0] * 3)],
     lambda k: dict(beta1_power=B1 ** k, beta2_power=B2 ** k, lr=0.01, beta1=B1, beta2=B2,
                    epsilon=1e-3), {}),
    ("adam_nesterov", "ApplyAdam", [("m", [0.0] * 3), ("v", [0.0] * 3)],
     lambda k: dict(beta1_power=B1 ** k, beta2_power=B2 ** k, lr=0.01, beta1=B1, beta2=B2,
                    epsilon=1e-3), dict(use_nesterov=True)),
    ("rmsprop", "ApplyRMSProp", [("ms", [1.0] * 3), ("mom", [0.0] * 3)],
     lambda k: dict(lr=0.01, rho=0.9, momentum=0.5, epsilon=1e-3), {}),
    ("centered_rmsprop", "ApplyCenteredRMSProp",
     [("mg", [0.0] * 3), ("ms", [1.0] * 3), ("mom", [0.0] * 3)],
     lambda k: dict(lr=0.01, rho=0.9, momentum=0.5, epsilon=1e-3), {}),
    ("adadelta", "ApplyAdadelta", [("accum", [0.0] * 3), ("accum_update", [0.0] * 3)],
     lambda k: dict(lr=1.0, rho=0.95, epsilon=0.1), {}),
    ("ftrl", "ApplyFtrl", [("accum", [0.1] * 3), ("linear", [0.0] * 3)],
     lambda k: dict(lr=0.5, l1=0.1, l2=0.2, lr_power=-0.5), {}),
    ("ftrl_lr_power", "ApplyFtrl", [("accum", [0.1] * 3), ("linear", [0.0] * 3)],
     lambda k: dict(lr=0.5, l1=0.1, l2=0.2, lr_power=-0.7), {}),
    ("ftrl_linear_by_lr", "ApplyFtrl", [("accum", [0.1] * 3), ("linear", [0.0] * 3)],
     lambda k: dict(lr=0.5, l1=0.1, l2=0.2, lr_power=-0.5), dict(multiply_linear_by_lr=True)),
    ("ftrl_v2", "ApplyFtrlV2", [("accum", [0.1] * 3), ("linear", [0.0] * 3)],
     lambda k: dict(lr=0.5, l1=0.1, l2=0.2, l2_shrinkage=0.1, lr_power=-0.5), {}),
    ("ftrl_v2_lr_power", "ApplyFtrlV2", [("accum", [0.1] * 3), ("linear", [0.0] * 3)],
     lambda k: dict(lr=0.5, l1=0.1, l2=0.2, l2_shrinkage=0.1, lr_power=-0.7), {}),
    ("ftrl_v2_linear_by_lr", "ApplyFtrlV2", [("accum", [0.1] * 3), ("linear", [0.0] * 3)],
     lambda k: dict(lr=0.5, l1=0.1, l2=0.2, l2_shrinkage=0.1, lr_power=-0.5),
     dict(multiply_linear_by_lr=True)),
    ("adamax", "ApplyAdaMax", [("m", [0.0] * 3), ("v", [0.0] * 3)],
     lambda k: dict(beta1_power=B1 ** k, lr=0.01, beta1=B1, beta2=B2, epsilon=1e-3), {}),
    ("add_sign", "ApplyAddSign", [("m", [0.0, 0.5, -0.5])],
     lambda k: dict(lr=0.1, alpha=1.0, sign_decay=0.5, beta=0.9), {}),
    ("power_sign", "ApplyPowerSign", [("m", [0.0, 0.5, -0.5])],
     lambda k: dict(lr=0.1, logbase=math.log(2.0), sign_decay=0.5, beta=0.9), {}),
]


def snake(name):
    out = ""
    for i, c in enumerate(name):
        if c.isupper() and i > 0 and not name[i - 1].isupper():
            out += "_"
        out += c.lower()
    return out


def run(case, dtype):
    name, op, slots, params, attrs = case
    g = tf.Graph()
    with g.as_default():
        var = tf.compat.v1.Variable(tf.constant(VAR0, dtype), use_resource=False, name="var")
        slot_vars = [tf.compat.v1.Variable(tf.constant(v, dtype), use_resource=False, name=n)
                     for n, v in slots]
        grad = tf.compat.v1.placeholder(dtype, [3])
        names = list(params(1).keys())
        phs = {n: tf.compat.v1.placeholder(dtype, []) for n in names}
        kwargs = dict(var=var)
        for (n, _), v in zip(slots, slot_vars):
            kwargs[n] = v
        grad_name = "delta" if op in ("ApplyGradientDescent", "ApplyProximalGradientDescent") else "grad"
        kwargs[grad_name] = grad
        kwargs.update(phs)
        kwargs.update(attrs)
        update = getattr(tf.raw_ops, op)(**kwargs)
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            steps = []
            for k, gr in enumerate(GRADS, start=1):
                feed = {grad: gr}
                for n, v in params(k).items():
                    feed[phs[n]] = v
                sess.run(update, feed)
                steps.append([sess.run(var).tolist()] + [sess.run(s).tolist() for s in slot_vars])
    return steps


def scatter_sequence():
    """The variable after each Scatter* update of one sequence, in order."""
    g = tf.Graph()
    with g.as_default():
        w = tf.compat.v1.Variable([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]],
                                  use_resource=False, name="w")
        raw = tf.raw_ops
        ops = [
            raw.ScatterUpdate(ref=w, indices=tf.constant([[3], [1]], tf.int32),
                              updates=[[[9.0, 9.5]], [[-1.0, -2.0]]]),
            raw.ScatterAdd(ref=w, indices=tf.constant([0, 0], tf.int64),
                           updates=[[1.0, 1.0], [2.0, 2.0]]),
            raw.ScatterSub(ref=w, indices=tf.constant([2], tf.int32), updates=[[0.5, 0.25]]),
            raw.ScatterMul(ref=w, indices=tf.constant(1, tf.int32), updates=[3.0, -3.0]),
            raw.ScatterDiv(ref=w, indices=tf.constant([3, 0], tf.int64), updates=2.0),
            raw.ScatterMin(ref=w, indices=tf.constant([0, 1], tf.int32),
                           updates=[[0.0, 10.0], [10.0, 0.0]]),
            raw.ScatterMax(ref=w, indices=tf.constant([2, 3], tf.int32),
                           updates=[[5.0, -5.0], [-5.0, 5.0]]),
        ]
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(w.initializer)
            return [sess.run(op).tolist() for op in ops]


for case in CASES:
    steps = run(case, tf.float64)
    print(f"// {case[0]}: {case[1]}")
    print(f"const {case[0].upper()}: [[[f64; 3]; {1 + len(case[2])}]; 3] = [")
    for s in steps:
        print("    [")
        for t in s:
            print("        [" + ", ".join(repr(float(x)) for x in t) + "],")
        print("    ],")
    print("];")

print("const SCATTER_SEQUENCE: [[[f64; 2]; 4]; 7] = [")
for rows in scatter_sequence():
    print("    [" + ", ".join("[" + ", ".join(repr(float(x)) for x in r) + "]" for r in rows) + "],")
print("];")
