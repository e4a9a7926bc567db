"""TensorFlow's side of tests/checkpoint_slices.rs: checkpoints of partitioned variables.

Commands (each prints one JSON line last):
  save PREFIX PARTS      tf.compat.v1.train.Saver saves `emb` [10,4] float32 and `ids` [7,3]
                         int64, both partitioned PARTS ways by fixed_size_partitioner, and
                         `bias` [4] whole.
  restore PREFIX PARTS   builds the same variables partitioned PARTS ways (zeros), restores them
                         with Saver.restore, and reads the checkpoint with
                         tf.train.load_checkpoint; prints the values both ways.
  shards DEST            writes the two shards a sharded saver on two ps tasks writes (emb's
                         parts 0 and 2 with bias on one, part 1 and ids on the other) with
                         SaveV2 and shape_and_slices, unmerged; prints their prefixes.
  merge DEST PREFIX...   MergeV2Checkpoints(PREFIX..., DEST).
  cluster_save PREFIX PARTS MASTER PS WORKER
                         on a cluster (MASTER the worker's grpc:// target, PS and WORKER
                         comma-separated addresses): the variables placed by
                         replica_device_setter over the ps tasks, saved by
                         Saver(sharded=True): each ps saves the parts it holds, then one merges.
  cluster_restore PREFIX PARTS MASTER PS WORKER
                         the same graph restores PREFIX with Saver(sharded=True) on the cluster
                         and prints the values and the part devices.
  fixtures ROOT          writes tests/data/checkpoints/tf_partitioned/ (save with 3 parts) and
                         tf_partitioned_sharded/ (shards, then merge).

Made with tensorflow-cpu 2.21.0:
    python3 tests/checkpoint_slices_tf.py fixtures tests/data/checkpoints
"""
import json
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EMB = (np.arange(40, dtype=np.float32).reshape(10, 4) * 0.5 - 3.0).astype(np.float32)
IDS = np.arange(21, dtype=np.int64).reshape(7, 3) * 1000003 - 7
BIAS = np.array([0.25, -1.5, 1e-30, 65504.0], dtype=np.float32)


def variables(parts):
    """emb and ids partitioned `parts` ways (zeros), bias whole (zeros)."""
    part = tf.compat.v1.fixed_size_partitioner(parts)
    zeros = tf.compat.v1.zeros_initializer()
    emb = tf.compat.v1.get_variable(
        "emb", shape=[10, 4], dtype=tf.float32, initializer=zeros, partitioner=part
    )
    ids = tf.compat.v1.get_variable(
        "ids", shape=[7, 3], dtype=tf.int64, initializer=zeros, partitioner=part
    )
    bias = tf.compat.v1.get_variable("bias", shape=[4], dtype=tf.float32, initializer=zeros)
    return emb, ids, bias


def assign_parts(sess, var, value):
    for p in var:
        info = p._save_slice_info
        o, n = info.var_offset[0], info.var_shape[0]
        sess.run(p.assign(value[o : o + n]))


def save(prefix, parts):
    graph = tf.Graph()
    with graph.as_default():
        emb, ids, bias = variables(parts)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assign_parts(sess, emb, EMB)
            assign_parts(sess, ids, IDS)
            sess.run(bias.assign(BIAS))
            saver.save(sess, prefix, write_meta_graph=False, write_state=False)
    specs = [p._save_slice_info.spec for p in emb]
    print(json.dumps({"prefix": prefix, "emb_specs": specs}))


def restore(prefix, parts):
    graph = tf.Graph()
    with graph.as_default():
        emb, ids, bias = variables(parts)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            saver.restore(sess, prefix)
            got = {
                "emb": sess.run(emb.as_tensor()).ravel().tolist(),
                "ids": [int(x) for x in sess.run(ids.as_tensor()).ravel()],
                "bias": sess.run(bias).ravel().tolist(),
                "parts": len(list(emb)),
            }
    reader = tf.train.load_checkpoint(prefix)
    got["loaded_emb"] = reader.get_tensor("emb").ravel().tolist()
    got["loaded_ids"] = [int(x) for x in reader.get_tensor("ids").ravel()]
    got["shapes"] = {k: list(v) for k, v in reader.get_variable_to_shape_map().items()}
    print(json.dumps(got))


def cluster_session(master, ps, worker):
    spec = tf.train.ClusterSpec({"ps": ps.split(","), "worker": worker.split(",")})
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:0"])
    config.cluster_def.CopyFrom(spec.as_cluster_def())
    setter = tf.compat.v1.train.replica_device_setter(
        cluster=spec, worker_device="/job:worker/task:0"
    )
    return spec, config, setter


def on_cluster(command, prefix, parts, master, ps, worker):
    _, config, setter = cluster_session(master, ps, worker)
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.device(setter):
        emb, ids, bias = variables(parts)
        saver = tf.compat.v1.train.Saver(sharded=True)
        with tf.compat.v1.Session(master, config=config) as sess:
            if command == "cluster_save":
                sess.run(tf.compat.v1.global_variables_initializer())
                assign_parts(sess, emb, EMB)
                assign_parts(sess, ids, IDS)
                sess.run(bias.assign(BIAS))
                saver.save(sess, prefix, write_meta_graph=False, write_state=False)
                got = {"prefix": prefix}
            else:
                saver.restore(sess, prefix)
                got = {
                    "emb": sess.run(emb.as_tensor()).ravel().tolist(),
                    "ids": [int(x) for x in sess.run(ids.as_tensor()).ravel()],
                    "bias": sess.run(bias).ravel().tolist(),
                    "parts": len(list(emb)),
                }
            got["devices"] = [p.device for p in emb]
    print(json.dumps(got))


def slice_spec(full, offset, length):
    """TensorFlow's spec of rows offset..offset+length of a [rows, cols] variable."""
    return "%d %d %d,%d:0,%d" % (full[0], full[1], offset, length, full[1])


def shards(dest):
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    parts = [dest + "_temp/part-00000-of-00002", dest + "_temp/part-00001-of-00002"]
    tf.raw_ops.SaveV2(
        prefix=parts[0],
        tensor_names=["bias", "emb", "emb"],
        shape_and_slices=["", slice_spec((10, 4), 0, 4), slice_spec((10, 4), 7, 3)],
        tensors=[tf.constant(BIAS), tf.constant(EMB[0:4]), tf.constant(EMB[7:10])],
    )
    tf.raw_ops.SaveV2(
        prefix=parts[1],
        tensor_names=["emb", "ids"],
        shape_and_slices=[slice_spec((10, 4), 4, 3), ""],
        tensors=[tf.constant(EMB[4:7]), tf.constant(IDS)],
    )
    print(json.dumps({"parts": parts}))


def merge(dest, prefixes):
    tf.raw_ops.MergeV2Checkpoints(
        checkpoint_prefixes=prefixes, destination_prefix=dest, delete_old_dirs=True
    )
    print(json.dumps({"merged": dest}))


def fixtures(root):
    one = os.path.join(root, "tf_partitioned")
    shutil.rmtree(one, ignore_errors=True)
    os.makedirs(one)
    save(os.path.join(one, "model.ckpt-4"), 3)
    sharded = os.path.join(root, "tf_partitioned_sharded")
    shutil.rmtree(sharded, ignore_errors=True)
    os.makedirs(sharded)
    dest = os.path.join(sharded, "model.ckpt-5")
    shards(dest)
    merge(dest, [dest + "_temp/part-00000-of-00002", dest + "_temp/part-00001-of-00002"])


def main(argv):
    command = argv[1]
    if command == "save":
        save(argv[2], int(argv[3]))
    elif command == "restore":
        restore(argv[2], int(argv[3]))
    elif command == "shards":
        shards(argv[2])
    elif command == "merge":
        merge(argv[2], argv[3:])
    elif command in ("cluster_save", "cluster_restore"):
        on_cluster(command, argv[2], int(argv[3]), argv[4], argv[5], argv[6])
    elif command == "fixtures":
        fixtures(argv[2])
    else:
        raise SystemExit("unknown command %r" % command)


if __name__ == "__main__":
    main(sys.argv)
