"""The data files users bring, written and read by their own tools, for tests/data_tensorflow.rs.

    data_tensorflow.py tfrecord DIR   writes DIR/train.tfrecord with tf.io.TFRecordWriter (the
                                      digits as tf.train.Examples: `pixels`, 64 floats; `rows`,
                                      8 int64 row sums; `label`, an int64) and prints, as one
                                      JSON line, what tf.io.parse_example reads from it
    data_tensorflow.py csv DIR        writes DIR/iris.csv (a header line, the label first, as
                                      pandas' to_csv writes it) and prints what pandas.read_csv
                                      reads from it

The JSON line: {"path": ..., "features": [[...], ...], "labels": [...]}, the features in the
order tessera is asked to read them.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def tfrecord(out_dir):
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = (digits.data / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    path = os.path.join(out_dir, "train.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for image, label in zip(images, labels):
            rows = image.reshape(8, 8).sum(axis=1).round().astype(np.int64)
            example = tf.train.Example(features=tf.train.Features(feature={
                "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=image)),
                "rows": tf.train.Feature(int64_list=tf.train.Int64List(value=rows)),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }))
            writer.write(example.SerializeToString())
    spec = {
        "pixels": tf.io.FixedLenFeature([64], tf.float32),
        "rows": tf.io.FixedLenFeature([8], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    serialized = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    parsed = tf.io.parse_example(serialized, spec)
    # --feature_keys pixels,rows: the pixels, then the row sums as floats.
    features = np.concatenate(
        [parsed["pixels"].numpy(), parsed["rows"].numpy().astype(np.float32)], axis=1)
    return path, features, parsed["label"].numpy()


def csv(out_dir):
    import numpy as np
    import pandas as pd
    from sklearn.datasets import load_iris

    iris = load_iris()
    frame = pd.DataFrame(iris.data, columns=["sepal length", "sepal width", "petal length",
                                             "petal width"])
    frame.insert(0, "species", iris.target)
    path = os.path.join(out_dir, "iris.csv")
    frame.to_csv(path, index=False)
    read = pd.read_csv(path)
    labels = read["species"].to_numpy()
    features = read.drop(columns=["species"]).to_numpy(dtype=np.float32)
    return path, features, labels


def main():
    kind, out_dir = sys.argv[1], sys.argv[2]
    path, features, labels = {"tfrecord": tfrecord, "csv": csv}[kind](out_dir)
    print(json.dumps({
        "path": path,
        "features": [[float(v) for v in row] for row in features],
        "labels": [int(v) for v in labels],
    }))


if __name__ == "__main__":
    main()
