"""TensorFlow's side of tests/op_coverage.rs: the ops of six everyday TensorFlow 2.21 graphs,
built in graph mode with tf.compat.v1, printed as one JSON line {graph name: [op, ...]}.

    python3 tests/op_coverage_tf.py

Each list is every op of the graph's GraphDef and of the bodies of its function library
(tf.data's map functions, a tf.function's body), sorted and without repeats. Nothing that
TensorFlow's own placer or master adds when it runs a graph (_Send, _Recv, _Arg, _Retval of
a partition) is in a GraphDef as Python writes it, so nothing needs taking out; a function
body's arguments and results are not nodes of its FunctionDef either.

The graphs:
  mlp       a TF1 MLP fed by a tf.data pipeline (uint8 pixels and int64 labels through
            from_tensor_slices, map, shuffle, repeat, batch, prefetch and a one-shot
            iterator), evaluated with in_top_k, trained with GradientDescent and Momentum
  wide_deep a wide-and-deep recommender from tf.compat.v1.feature_column, its variables
            partitioned over two ps tasks, Ftrl for the wide part and Adagrad for the deep,
            fed by ParseExampleV2 over serialized tf.train.Examples
  resnet    a ResNet block on uint8 images cast in the graph, with its gradients
  seq2seq   a decoder step with tf.math.top_k and tf.cumsum
  metrics   tf.compat.v1.metrics.accuracy and .auc
  half      a float16 MLP forward and gradient
"""
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

v1 = tf.compat.v1
v1.disable_eager_execution()
rng = np.random.default_rng(20261128)


def ops_of(graph):
    gd = graph.as_graph_def()
    ops = {n.op for n in gd.node}
    for f in gd.library.function:
        ops |= {n.op for n in f.node_def}
    return sorted(ops)


def mlp():
    g = tf.Graph()
    with g.as_default():
        pixels = rng.integers(0, 256, [64, 784], dtype=np.uint8)
        labels = rng.integers(0, 10, [64], dtype=np.int64)

        def scale(x, y):
            return tf.cast(x, tf.float32) / 255.0, y

        ds = (tf.data.Dataset.from_tensor_slices((pixels, labels)).map(scale)
              .shuffle(64, seed=1).repeat().batch(16).prefetch(2))
        x, y = v1.data.make_one_shot_iterator(ds).get_next()
        w1 = v1.get_variable("w1", [784, 32], initializer=v1.glorot_uniform_initializer())
        b1 = v1.get_variable("b1", [32], initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [32, 10], initializer=v1.glorot_uniform_initializer())
        b2 = v1.get_variable("b2", [10], initializer=v1.zeros_initializer())
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        logits = tf.matmul(h, w2) + b2
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        correct = v1.nn.in_top_k(logits, y, 1)
        tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
        step = v1.train.get_or_create_global_step()
        v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        v1.global_variables_initializer()
    return g


def wide_deep():
    fc = v1.feature_column
    g = tf.Graph()
    with g.as_default():
        def example(i):
            f = tf.train.Feature
            return tf.train.Example(features=tf.train.Features(feature={
                "user": f(bytes_list=tf.train.BytesList(value=[b"user_%d" % i])),
                "item": f(bytes_list=tf.train.BytesList(value=[b"item_%d" % (i * 7)])),
                "country": f(bytes_list=tf.train.BytesList(value=[[b"DE", b"FR", b"US"][i % 3]])),
                "age": f(float_list=tf.train.FloatList(value=[20.0 + i])),
                "price": f(float_list=tf.train.FloatList(value=[1.5 * i])),
                "label": f(int64_list=tf.train.Int64List(value=[i % 2])),
            })).SerializeToString()

        records = [example(i) for i in range(32)]
        user = fc.categorical_column_with_hash_bucket("user", 100)
        item = fc.categorical_column_with_hash_bucket("item", 100)
        country = fc.categorical_column_with_vocabulary_list("country", ["DE", "FR", "US"])
        age = fc.numeric_column("age")
        age_buckets = fc.bucketized_column(age, [25.0, 35.0, 45.0])
        price = fc.numeric_column("price")
        cross = fc.crossed_column(["user", country], 50)
        wide = [user, item, country, age_buckets, cross]
        deep = [fc.embedding_column(user, 8, combiner="sqrtn"),
                fc.embedding_column(item, 8, combiner="sqrtn"),
                fc.indicator_column(country), age, price]
        spec = fc.make_parse_example_spec(wide + deep)
        spec["label"] = tf.io.FixedLenFeature([1], tf.int64)

        def parse(serialized):
            features = tf.io.parse_example(serialized, spec)
            label = features.pop("label")
            return features, label

        ds = tf.data.Dataset.from_tensor_slices(records).batch(8).map(parse).repeat()
        features, label = v1.data.make_one_shot_iterator(ds).get_next()
        setter = v1.train.replica_device_setter(ps_tasks=2)
        partitioner = v1.fixed_size_partitioner(2)
        with v1.device(setter):
            with v1.variable_scope("wide", partitioner=partitioner):
                wide_logits = fc.linear_model(features, wide)
            with v1.variable_scope("deep", partitioner=partitioner):
                net = fc.input_layer(features, deep)
                net = v1.layers.dense(net, 16, activation=tf.nn.relu)
                deep_logits = v1.layers.dense(net, 1)
            logits = wide_logits + deep_logits
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(label, tf.float32), logits=logits))
            wide_vars = v1.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES, "wide")
            deep_vars = v1.get_collection(v1.GraphKeys.TRAINABLE_VARIABLES, "deep")
            step = v1.train.get_or_create_global_step()
            train_wide = v1.train.FtrlOptimizer(0.1).minimize(loss, var_list=wide_vars)
            train_deep = v1.train.AdagradOptimizer(0.1).minimize(
                loss, var_list=deep_vars, global_step=step)
            tf.group(train_wide, train_deep)
        v1.global_variables_initializer()
        v1.tables_initializer()
    return g


def resnet():
    g = tf.Graph()
    with g.as_default():
        images = v1.placeholder(tf.uint8, [4, 16, 16, 3])
        x = tf.cast(images, tf.float32) / 255.0
        x = v1.layers.conv2d(x, 8, 3, padding="same", use_bias=False)
        shortcut = x
        y = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]])
        y = v1.layers.conv2d(y, 8, 3, padding="valid", use_bias=False)
        y = v1.layers.batch_normalization(y, training=True)
        y = tf.nn.relu(y)
        y = tf.pad(y, [[0, 0], [1, 1], [1, 1], [0, 0]])
        y = v1.layers.conv2d(y, 8, 3, padding="valid", use_bias=False)
        y = v1.layers.batch_normalization(y, training=True)
        out = tf.nn.relu(y + shortcut)
        loss = tf.reduce_mean(tf.square(out))
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            v1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        v1.global_variables_initializer()
    return g


def seq2seq():
    g = tf.Graph()
    with g.as_default():
        vocab, hidden, beam = 50, 16, 4
        tokens = v1.placeholder(tf.int32, [beam])
        state = v1.placeholder(tf.float32, [beam, hidden])
        scores = v1.placeholder(tf.float32, [beam])
        emb = v1.get_variable("embedding", [vocab, hidden])
        cell = v1.nn.rnn_cell.GRUCell(hidden)
        out, new_state = cell(tf.nn.embedding_lookup(emb, tokens), state)
        logits = v1.layers.dense(out, vocab)
        log_probs = tf.nn.log_softmax(logits) + scores[:, None]
        flat = tf.reshape(log_probs, [-1])
        best, index = tf.math.top_k(flat, k=beam)
        beams = index // vocab
        words = index % vocab
        tf.gather(new_state, beams, name="next_state")
        probs = tf.nn.softmax(logits)
        sorted_probs = tf.sort(probs, direction="DESCENDING")
        tf.cumsum(sorted_probs, axis=-1, name="nucleus")
        tf.identity(words, name="next_words")
        tf.identity(best, name="next_scores")
        v1.global_variables_initializer()
    return g


def metrics():
    g = tf.Graph()
    with g.as_default():
        labels = v1.placeholder(tf.int64, [None])
        predictions = v1.placeholder(tf.int64, [None])
        probs = v1.placeholder(tf.float32, [None])
        v1.metrics.accuracy(labels, predictions)
        v1.metrics.auc(labels, probs)
        v1.local_variables_initializer()
    return g


def half():
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float16, [8, 16])
        y = v1.placeholder(tf.int32, [8])
        w1 = v1.get_variable("w1", [16, 32], tf.float16)
        b1 = v1.get_variable("b1", [32], tf.float16, initializer=v1.zeros_initializer())
        w2 = v1.get_variable("w2", [32, 4], tf.float16)
        h = tf.nn.relu(tf.matmul(x, w1) + b1)
        logits = tf.matmul(h, w2)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        v1.train.GradientDescentOptimizer(tf.constant(0.1, tf.float16)).minimize(loss)
        v1.global_variables_initializer()
    return g


def main():
    graphs = dict(mlp=mlp, wide_deep=wide_deep, resnet=resnet, seq2seq=seq2seq,
                  metrics=metrics, half=half)
    print(json.dumps({name: ops_of(build()) for name, build in graphs.items()}))


if __name__ == "__main__":
    main()
