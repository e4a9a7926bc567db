"""TensorFlow's side of tests/kernels_strings.rs: what stock TensorFlow computes for the string
and parsing ops (StringSplit(V2), Substr, RegexReplace, StaticRegexReplace, StringLength,
StringLower/Upper, StringStrip, StringJoin, AsString, StringFormat, DecodeRaw, DecodeCSV,
StringToNumber, ParseExampleV2, ParseSingleExample, Print, PrintV2, ReadFile, WriteFile) on
seeded inputs, printed as one JSON line.

    python3 tests/kernels_strings_tf.py

Inputs are printed with the outputs, so the Rust side runs its kernels on exactly these.
Tensors are {"dtype", "shape", "values"} with floats as the bits of their float64 value and
strings as hex. A case TensorFlow refuses carries its error's code and message instead of
outputs (`prefix` when only the start of the message is TensorFlow's own, as for RE2's
explanation of a bad pattern).
"""
import json
import os
import re
import struct

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

rng = np.random.default_rng(20261202)

# Each op's inputs: (name, the type attr it sets, whether it is a list of tensors).
SIGNATURES = {
    "StringSplit": [("input", None, False), ("delimiter", None, False)],
    "StringSplitV2": [("input", None, False), ("sep", None, False)],
    "Substr": [("input", None, False), ("pos", "T", False), ("len", None, False)],
    "RegexReplace": [("input", None, False), ("pattern", None, False),
                     ("rewrite", None, False)],
    "StaticRegexReplace": [("input", None, False)],
    "StringLength": [("input", None, False)],
    "StringLower": [("input", None, False)],
    "StringUpper": [("input", None, False)],
    "StringStrip": [("input", None, False)],
    "StringJoin": [("inputs", None, True)],
    "AsString": [("input", "T", False)],
    "StringFormat": [("inputs", "T", True)],
    "DecodeRaw": [("bytes", None, False)],
    "DecodeCSV": [("records", None, False), ("record_defaults", "OUT_TYPE", True)],
    "StringToNumber": [("string_tensor", None, False)],
    "ParseExampleV2": [("serialized", None, False), ("names", None, False),
                       ("sparse_keys", None, False), ("dense_keys", None, False),
                       ("ragged_keys", None, False), ("dense_defaults", "Tdense", True)],
    "ParseSingleExample": [("serialized", None, False), ("dense_defaults", "Tdense", True)],
    "Print": [("input", "T", False), ("data", "U", True)],
    "PrintV2": [("input", None, False)],
    "ReadFile": [("filename", None, False)],
    "WriteFile": [("filename", None, False), ("contents", None, False)],
}
CODES = {
    tf.errors.InvalidArgumentError: "INVALID_ARGUMENT",
    tf.errors.ResourceExhaustedError: "RESOURCE_EXHAUSTED",
    tf.errors.UnimplementedError: "UNIMPLEMENTED",
    tf.errors.NotFoundError: "NOT_FOUND",
    tf.errors.FailedPreconditionError: "FAILED_PRECONDITION",
}


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def dtype_name(a):
    return "string" if a.dtype.kind in "SO" else a.dtype.name


def encode(a):
    a = np.asarray(a)
    if a.dtype.kind in "SO":
        values = [bytes(v).hex() for v in a.ravel()]
    elif a.dtype.kind == "f":
        values = [bits(v) for v in a.astype(np.float64).ravel()]
    else:
        values = a.ravel().tolist()
    return dict(dtype=dtype_name(a), shape=list(a.shape), values=values)


def encode_attr(key, v):
    if key == "dense_shapes":
        return dict(list_shape=v)
    if isinstance(v, tf.dtypes.DType):
        return dict(type=v.name)
    if isinstance(v, bool):
        return dict(b=v)
    if isinstance(v, int):
        return dict(i=v)
    if isinstance(v, str):
        return dict(s=v.encode().hex())
    if isinstance(v, list) and all(isinstance(x, tf.dtypes.DType) for x in v):
        return dict(list_type=[x.name for x in v])
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return dict(list_s=v)
    return dict(list_i=v)


def tf_message(e):
    m = e.message
    m = re.sub(r"^\{\{function_node [^}]*\}\} ", "", m)
    m = re.sub(r" \[Op:\w+\]( name: .*)?$", "", m, flags=re.S)
    return m.split("\n\t; NodeDef:")[0]


def array(x):
    """`x` as a numpy array, Python strings as UTF-8 bytes."""
    def utf8(v):
        if isinstance(v, list):
            return [utf8(y) for y in v]
        return v.encode() if isinstance(v, str) else v

    def has_bytes(v):
        return isinstance(v, bytes) or (isinstance(v, list) and any(map(has_bytes, v)))

    x = utf8(x)
    if has_bytes(x):
        return np.array(x, dtype=object)
    a = np.asarray(x)
    if a.dtype.kind in "US":
        a = np.array(utf8(a.tolist()), dtype=object)
    return a


def case(name, op, inputs, prefix=False, **attrs):
    sig = SIGNATURES[op]
    flat, args = [], {}
    out = dict(name=name, op=op, attrs={k: encode_attr(k, v) for k, v in attrs.items()})
    for (arg, type_attr, is_list), x in zip(sig, inputs):
        if is_list:
            xs = [array(v) for v in x]
            flat += xs
            args[arg] = [tf.constant(v) for v in xs]
            if type_attr:
                out["attrs"][type_attr] = dict(list_type=[dtype_name(v) for v in xs])
            else:
                out["attrs"]["N"] = dict(i=len(xs))
        else:
            a = array(x)
            flat.append(a)
            args[arg] = tf.constant(a)
            if type_attr:
                out["attrs"][type_attr] = dict(type=dtype_name(a))
    out["inputs"] = [encode(x) for x in flat]
    try:
        y = getattr(tf.raw_ops, op)(**args, **attrs)
        if y is None:
            ys = []
        elif isinstance(y, (list, tuple)):
            ys = [t for part in y for t in (part if isinstance(part, list) else [part])]
        else:
            ys = [y]
        out["outputs"] = [encode(t.numpy()) for t in ys]
    except tf.errors.OpError as e:
        message = tf_message(e)
        if prefix:
            message = message[:message.index("error: ") + len("error: ")]
        out["error"] = dict(code=CODES[type(e)], message=message)
    return out


def split_cases():
    words = ["a,b;;c", ",x,", "", "ab c", "  lead  trail  ", "1<>2<><>3", "a\tb\nc\vd"]
    return [
        case("any of the delimiters", "StringSplit", [words, ",;"], skip_empty=False),
        case("skip empty", "StringSplit", [words, ",;"]),
        case("bytes", "StringSplit", [["ab c", "", "é"], ""]),
        case("one row", "StringSplit", [["no delimiter"], ","]),
        case("empty batch", "StringSplit", [np.array([], object), ","]),
        case("matrix", "StringSplit", [[["a"]], ","]),
        case("vector delimiter", "StringSplit", [["a"], [","]]),
        case("whitespace", "StringSplitV2", [words, ""]),
        case("a separator", "StringSplitV2", [words, "<>"]),
        case("maxsplit", "StringSplitV2", [["a,b,c,d", " a  b c ", ",,"], ","], maxsplit=2),
        case("whitespace, maxsplit", "StringSplitV2", [[" a  b c d ", "x"], ""], maxsplit=2),
        case("maxsplit 0", "StringSplitV2", [[" a b ", ""], ""], maxsplit=0),
        case("scalar input", "StringSplitV2", ["a b", ""]),
        case("vector sep", "StringSplitV2", [["a b"], ["x"]]),
    ]


def substr_cases():
    i32, i64 = np.int32, np.int64
    s = ["hello", "world", "", "héllo wörld"]
    return [
        case("elementwise", "Substr", [s, np.array([1, -3, 0, 2], i32),
                                       np.array([2, 10, 0, 4], i32)]),
        case("scalar pos", "Substr", [s[:2], i64(1), i64(3)]),
        case("negative len", "Substr", [["hello"], np.array([1], i32), np.array([-1], i32)]),
        case("broadcast to a matrix", "Substr", [[["hello"], ["world"]],
                                                 np.array([0, 1, 2], i32),
                                                 np.array([1, 2, 3], i32)]),
        case("broadcast a row", "Substr", [["hello", "world"], np.array([[0, 1], [2, 3]], i32),
                                           np.array([[1, 1], [2, 2]], i32)]),
        case("utf-8 characters", "Substr", [["héllo", "日本語のテキスト", "ab"],
                                            np.array([1, -4, 2], i32),
                                            np.array([2, 3, 5], i32)], unit="UTF8_CHAR"),
        case("pos past the end", "Substr", [["hello", "hi"], np.array([1, 3], i32),
                                            np.array([2, 2], i32)]),
        case("pos before the start", "Substr", [["hello", "hi"], np.array([1, -3], i32),
                                                np.array([2, 2], i32)]),
        case("pos and len disagree", "Substr", [["hello"], np.array([1, 2], i32),
                                                np.array([2], i32)]),
        case("incompatible", "Substr", [["ab", "cd", "ef"], np.array([0, 1], i32),
                                        np.array([1, 1], i32)]),
        case("three dimensions", "Substr", [[[["a"]]], np.array([[[0, 1]]], i32),
                                            np.array([[[1, 1]]], i32)]),
    ]


def regex_cases():
    text = ["baaa", "abc", "héllo wörld 12", "x١٢3", "", "ÉéΣσς a1 ١b", "a{b} a.b"]
    rr = lambda name, p, r, **kw: case(name, "RegexReplace", [text, p, r], **kw)  # noqa: E731
    return [
        rr("empty matches", "a*", "-"),
        rr("groups", r"(\w+)\s(\w+)", r"\2 \1 \\ \0 $1"),
        rr("ascii digits", r"\d", "#"),
        rr("ascii word characters", r"\w+", r"<\0>"),
        rr("not word characters", r"\W", "."),
        rr("classes with perl escapes", r"[\d\s]", "."),
        rr("ascii word boundaries", r"\b", "|"),
        rr("any character", r".", "#"),
        rr("case folding", r"(?i)é|σ", "."),
        rr("first only", r"a", "b", replace_global=False),
        rr("a group the pattern lacks", r"a", r"\1"),
        rr("a trailing backslash", r"(a)", "\\"),
        rr("a literal <", r"\<", "-"),
        rr("a literal brace", r"a{", "-"),
        rr("quoted", r"\Qa.b\E", "-"),
        rr("the empty pattern", r"", "-"),
        rr("a bad pattern", r"a(", "b", prefix=True),
        rr("a lookahead", r"a(?=b)", "-", prefix=True),
        case("a vector pattern", "RegexReplace", [["abc"], ["a"], "-"]),
        case("invalid utf-8", "RegexReplace", [[b"\xff\xfeab"], "", "-"]),
        case("static", "StaticRegexReplace", [text], pattern=r"(\d+)", rewrite=r"<\1>"),
        case("static first", "StaticRegexReplace", [text], pattern="[aeiou]", rewrite="_",
             replace_global=False),
        case("static spaces", "StaticRegexReplace", [["a\vb c\td"]], pattern=r"\s",
             rewrite="_"),
        case("static bad", "StaticRegexReplace", [["a"]], pattern="a(", rewrite="b",
             prefix=True),
    ]


def simple_cases():
    s = ["héllo", "", "日本語", "ABC xyz", " \t\va b\n\f\r", "ΣΑΣ İ", "straße ﬁ"]
    return [
        case("bytes", "StringLength", [s]),
        case("characters", "StringLength", [s + [b"\xff\xc3"]], unit="UTF8_CHAR"),
        case("matrix", "StringLength", [[["a", "bb"], ["", "ccc"]]]),
        case("ascii", "StringLower", [s]),
        case("utf-8", "StringLower", [s], encoding="utf-8"),
        case("ascii", "StringUpper", [s]),
        case("utf-8", "StringUpper", [s], encoding="utf-8"),
        case("invalid utf-8", "StringUpper", [[b"A\xffb"]], encoding="utf-8"),
        case("latin1", "StringUpper", [["a"]], encoding="latin1"),
        case("whitespace", "StringStrip", [s]),
        case("scalars broadcast", "StringJoin", [[["a", "b"], "x", ["c", "d"]]],
             separator="-"),
        case("no inputs", "StringJoin", [[]], separator="-"),
    ]


def as_string_cases():
    f = np.array([0.5, 1.5, 2.5, -0.0, 1e20, 1 / 3, np.nan, -np.inf, 123456789.0, 1e-5,
                  2.675, 100000, 1e6, 0.0001], np.float32)
    f = np.concatenate([f, rng.uniform(-1e4, 1e4, 20).astype(np.float32),
                        (10.0 ** rng.uniform(-12, 12, 20)).astype(np.float32)])
    d = np.concatenate([f.astype(np.float64), [1e300, 5e-324, 0.1, 2.675, -1e-300],
                        rng.normal(0, 1e3, 20)])
    i = np.array([1, -22, 333, 0, 2**31 - 1, -2**31], np.int32)
    out = []
    for dtype, x in [("float32", f), ("float64", d)]:
        out += [
            case(f"{dtype} %f", "AsString", [x]),
            case(f"{dtype} %g", "AsString", [x], shortest=True),
            case(f"{dtype} %.2e", "AsString", [x], scientific=True, precision=2),
            case(f"{dtype} %08.1f", "AsString", [x], precision=1, width=8, fill="0"),
            case(f"{dtype} %-6.0f", "AsString", [x], precision=0, width=6, fill="-"),
            case(f"{dtype} %#g", "AsString", [x], shortest=True, fill="#"),
            case(f"{dtype} %.3g", "AsString", [x], shortest=True, precision=3),
            case(f"{dtype} %+.0g", "AsString", [x], shortest=True, precision=0, fill="+"),
            case(f"{dtype} % e", "AsString", [x], scientific=True, fill=" "),
        ]
    return out + [
        case("int32 %+5d", "AsString", [i], width=5, fill="+"),
        case("int64 % 5d", "AsString", [np.array([1, -22, 2**62, -2**63], np.int64)],
             width=5, fill=" "),
        case("int32 %04d", "AsString", [np.array([-5, 5], np.int32)], width=4, fill="0"),
        case("bools", "AsString", [[True, False]], width=7, fill="0"),
        case("strings", "AsString", [["ab", "c"]], width=4),
        case("strings, left", "AsString", [["ab", "c"]], width=4, fill="-"),
        case("int precision", "AsString", [i], precision=2),
        case("int scientific", "AsString", [i], scientific=True),
        case("bool precision", "AsString", [[True]], precision=1),
        case("scientific and shortest", "AsString", [f], scientific=True, shortest=True),
        case("two fill characters", "AsString", [f], fill="00"),
        case("a fill that is no flag", "AsString", [f], fill="x"),
    ]


def format_cases():
    fmt = lambda name, xs, **kw: case(name, "StringFormat", [xs], **kw)  # noqa: E731
    return [
        fmt("vector and matrix", [np.arange(10, dtype=np.int32),
                                  np.array([[1.5, 2], [3, 4]], np.float32)],
            template="a {} b {} c", placeholder="{}", summarize=3),
        fmt("every dtype", [np.array(["x", "y"]), "sc", True, np.array([True, False]),
                            np.float32(0.1), np.float64(0.1), np.float32(1 / 3),
                            np.float64(1 / 3), np.float32(1e20), np.int64(-5)],
            template=" ".join(["{}"] * 10), placeholder="{}"),
        fmt("3-d, one at each end", [np.arange(24).reshape(2, 3, 4)], template="{}",
            placeholder="{}", summarize=1),
        fmt("matrix, two at each end", [np.arange(100).reshape(10, 10)], template="{}",
            placeholder="{}", summarize=2),
        fmt("everything", [np.arange(10)], template="{}", placeholder="{}", summarize=-1),
        fmt("nothing", [np.arange(10)], template="{}", placeholder="{}", summarize=0),
        fmt("empty", [np.zeros([0]), np.zeros([2, 0]), np.zeros([0, 3])],
            template="{} {} {}", placeholder="{}"),
        fmt("scalar, nothing", [np.int32(5)], template="{}", placeholder="{}", summarize=0),
        fmt("six and seven", [np.arange(6), np.arange(7)], template="{} {}",
            placeholder="{}"),
        fmt("column", [np.arange(8).reshape(8, 1)], template="{}", placeholder="{}",
            summarize=2),
        fmt("floats", [np.array([1e-7, 123456.7, 1234567.0, np.nan, -np.inf, -0.0],
                                np.float32)], template="{}", placeholder="{}", summarize=-1),
        fmt("escapes", [np.array([b'a"b', b"it's", b"\n", b"\x01\x7f\xc3\xa9\xff\t\\"])],
            template="{}", placeholder="{}"),
        fmt("default placeholder", [np.int32(1), np.int32(2)], template="%s and %s"),
        fmt("too few inputs", [np.int32(1)], template="{} {}", placeholder="{}"),
    ]


def decode_raw_cases():
    return [
        case("int32", "DecodeRaw", [[b"\x01\x00\x00\x00\x02\x00\x00\x00",
                                     b"\xff\xff\xff\xff\x00\x00\x00\x80"]], out_type=tf.int32),
        case("big endian", "DecodeRaw", [[b"\x01\x00\x00\x00\x02\x00\x00\x00"]],
             out_type=tf.int32, little_endian=False),
        case("float32 scalar", "DecodeRaw", [b"\x00\x00\x80\x3f"], out_type=tf.float32),
        case("float64 big endian", "DecodeRaw",
             [[np.float64(-1.25).byteswap().tobytes()]], out_type=tf.float64,
             little_endian=False),
        case("int64 matrix", "DecodeRaw",
             [[[rng.integers(-2**62, 2**62, 2).astype(np.int64).tobytes()] * 2]],
             out_type=tf.int64),
        case("bool", "DecodeRaw", [[b"\x00\x01\x02"]], out_type=tf.bool),
        case("empty strings", "DecodeRaw", [["", ""]], out_type=tf.float64),
        case("sizes differ", "DecodeRaw", [[b"\x00\x01\x02\x03", b"\x00" * 8]],
             out_type=tf.int32),
        case("not a multiple", "DecodeRaw", [[b"\x00\x01\x02\x03\x04"]], out_type=tf.int32),
    ]


def number_cases():
    good_f = [" 12 ", "1e3", "+5", "-0", "inf", "nan", "-Infinity", "1e400", "0x10",
              "1.5e-50", "3.", ".5", "INF", "NaN", "infinity", "0x1p3", "+.5e+2", "\v1\v",
              "\t2\n", "-0x1.8p1", "0X10", "0x.8", "16777217", "3.4028235677973366e38",
              "1.00000005960464477539062500000001", "1e39", "-1e39", "1e-50", "-7.25"]
    bad_f = ["abc", "", " ", "1 2", "1.0.0", "1e", "1d", "1f", "--1", "+-1", "0x", "1,5"]
    good_i = [" 12 ", "+5", "-0", " 7", "007", "-2147483648", "2147483647", "\v1\v"]
    bad_i = ["1.5", "0x10", "2147483648", "", "1e3", "--1", "1 2"]
    out = [
        case("floats", "StringToNumber", [good_f], out_type=tf.float32),
        case("doubles", "StringToNumber", [good_f], out_type=tf.float64),
        case("int32", "StringToNumber", [good_i], out_type=tf.int32),
        case("int64", "StringToNumber", [["9223372036854775807", "-9223372036854775808"]],
             out_type=tf.int64),
        case("default float", "StringToNumber", [[["1.5"], ["-2"]]]),
    ]
    out += [case(f"float {s!r}", "StringToNumber", [[s]], out_type=tf.float64) for s in bad_f]
    out += [case(f"int32 {s!r}", "StringToNumber", [[s]], out_type=tf.int32) for s in bad_i]
    out.append(case("int64 overflow", "StringToNumber", [["9223372036854775808"]],
                    out_type=tf.int64))
    return out


def csv_cases():
    i32, i64, f32, f64 = np.int32, np.int64, np.float32, np.float64
    d = lambda x, t: np.array([x], t)  # noqa: E731
    s = lambda x: np.array([x.encode()], object)  # noqa: E731
    req = lambda t: np.zeros([0], t)  # noqa: E731
    csv = lambda name, recs, defs, **kw: case(name, "DecodeCSV", [recs, defs], **kw)  # noqa
    return [
        csv("quotes and defaults", ['1,"a,b",2.5,x', '2,"q""uote",,', ',,,',
                                    '-3,"",1e3,"y"""'],
            [d(7, i32), s("d"), d(0.5, f32), s("z")]),
        csv("na_value", ['NA,3', '4,NA', 'NA,NA'], [d(7, i64), d(1.0, f64)], na_value="NA"),
        csv("whitespace around numbers", [' 1 , 2.5 ,\t-3\t'], [d(0, i32), d(0, f32),
                                                                    d(0, i64)]),
        csv("tabs", ['a\tb', '\tc'], [s(""), s("q")], field_delim="\t"),
        csv("quotes kept", ['a"b,1'], [s(""), d(0, i32)], use_quote_delim=False),
        csv("select columns", ['1,2,3,4', '5,,7,'], [d(0, i32), d(-1, i32)],
            select_cols=[1, 3]),
        csv("scalar defaults, 2-d records", [[['1,2'], ['3,']]], [np.int32(0), np.int32(9)]),
        csv("a newline starting a field", ['1,\n2'], [d(0, i32), d(0, i32)]),
        csv("quoted empty gets the default", ['"",1'], [s("dflt"), np.int32(9)]),
        csv("hex and infinity", ['0x10,inf,-nan'], [np.float32(0), np.float64(0),
                                                    np.float64(0)]),
        csv("a doubled quote at the end", ['"a""",1'], [s(""), np.int32(0)]),
        csv("strings as they are", [' x ,"  y "'], [s(""), s("")]),
        csv("a required field missing", ['1,', ',2'], [req(i32), d(1, i32)]),
        csv("too many fields", ['1,2', '1,2,3'], [d(0, i32), d(0, i32)]),
        csv("too few fields", ['1'], [d(0, i32), d(0, i32)]),
        csv("an empty record", [''], [np.int32(5), np.int32(9)]),
        csv("not an int32", ['1,x'], [d(0, i32), d(0, i32)]),
        csv("int32 overflow", ['1,3000000000'], [d(0, i32), d(0, i32)]),
        csv("not a float", ['1,x'], [d(0, i32), d(0, f32)]),
        csv("not a double", ['1,1.5.'], [d(0, i32), d(0, f64)]),
        csv("not an int64", ['1,0x1'], [d(0, i32), d(0, i64)]),
        csv("an unescaped quote", ['"a"b,1'], [s(""), d(0, i32)]),
        csv("a quote inside", ['a"b,1'], [s(""), d(0, i32)]),
        csv("a space before a quote", [' "a",1'], [s(""), np.int32(0)]),
        csv("an unterminated quote", ['"abc,1'], [s(""), d(0, i32)]),
        csv("a carriage return", ['1,2\r\n'], [np.int32(5), np.int32(9)]),
        csv("two-byte delimiter", ['a\tb'], [s(""), s("")], field_delim="ab"),
        csv("no delimiter", ['a\tb'], [s(""), s("")], field_delim=""),
        csv("selected columns past the end", ['1,2'], [d(0, i32), d(0, i32)],
            select_cols=[1, 3]),
        csv("unsorted columns", ['1,2,3,4'], [d(0, i32), d(0, i32)], select_cols=[3, 1]),
        csv("a negative column", ['1,2,3,4'], [d(0, i32), d(0, i32)], select_cols=[-1, 1]),
        csv("too few columns", ['1,2,3,4'], [d(0, i32), d(0, i32)], select_cols=[1]),
        csv("two defaults", ['1,2'], [np.array([0, 1], i32), d(0, i32)]),
    ]


F = tf.train.Feature


def ints(v):
    return F(int64_list=tf.train.Int64List(value=v))


def floats(v):
    return F(float_list=tf.train.FloatList(value=v))


def strs(v):
    return F(bytes_list=tf.train.BytesList(value=v))


def example(**features):
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def parse_cases():
    e1 = example(age=ints([3]), w=floats([1.0, 2.0, 3.0]), tags=strs([b"a", b"b"]),
                 n=ints([1, 2, 3, 4]), v=floats(rng.normal(size=4).tolist()))
    e2 = example(age=ints([5]), tags=strs([b"c"]), w=floats([1.0]),
                 v=floats(rng.normal(size=4).tolist()), big=ints([-2**63, 2**63 - 1]))
    e3 = example(age=floats([5.0]), w=floats([1.0, 2.0]))
    empty = example()
    nokind = example(age=F())
    i64, f32 = np.int64, np.float32
    V2 = "ParseExampleV2"

    def v2(name, ser, dense=(), sparse=(), names=(), ragged=()):
        """dense: (key, default, shape); sparse: (key, dtype)."""
        return case(name, V2, [
            ser, np.array([n.encode() for n in names], object),
            np.array([k.encode() for k, _ in sparse], object),
            np.array([k.encode() for k, _, _ in dense], object),
            np.array([k.encode() for k in ragged], object), [x for _, x, _ in dense]],
            num_sparse=len(sparse), sparse_types=[t for _, t in sparse],
            ragged_value_types=[tf.string] * len(ragged),
            ragged_split_types=[tf.int64] * len(ragged),
            dense_shapes=[s for _, _, s in dense])

    def single(name, ser, dense=(), sparse=()):
        return case(name, "ParseSingleExample", [ser, [x for _, x, _ in dense]],
                    num_sparse=len(sparse), sparse_keys=[k for k, _ in sparse],
                    dense_keys=[k for k, _, _ in dense], sparse_types=[t for _, t in sparse],
                    dense_shapes=[s for _, _, s in dense])

    batch = [e1, e2, empty, nokind]
    return [
        v2("dense and sparse", batch, [("age", np.array([-1], i64), [1]),
                                       ("v", np.zeros([2, 2], f32), [2, 2]),
                                       ("n", np.zeros(4, i64), [4])],
           [("tags", tf.string), ("w", tf.float32), ("big", tf.int64)]),
        v2("a scalar dense feature", [e1, e2], [("age", np.int64(9), [])]),
        v2("string dense with defaults", [e2, empty], [("tags", np.array([b"d"], object), [1])]),
        v2("one example as a scalar", e1, [("age", np.array([-1], i64), [1])],
           [("tags", tf.string)]),
        v2("named", [e1, e2], [("age", np.array([-1], i64), [1])], names=["first", "second"]),
        v2("variable length", [e1, e2, empty], [("w", np.float32(-1), [-1]),
                                                ("n", np.int64(0), [-1, 2])]),
        v2("no features asked", [e1], []),
        v2("empty batch", np.array([], object), [("age", np.array([-1], i64), [1])],
           [("tags", tf.string)]),
        v2("required and missing", [e1, e2], [("n", np.zeros([0], i64), [4])]),
        v2("required and missing, named", [e1, e2], [("n", np.zeros([0], i64), [4])],
           names=["first", "second"]),
        v2("too few values", [e1, e3], [("w", np.zeros(3, f32), [3])]),
        v2("too many strings", [e1], [("tags", np.array([b""], object), [1])]),
        v2("too few strings", [e2], [("tags", np.array([b"", b""], object), [2])]),
        v2("too many floats", [e1], [("w", np.zeros(2, f32), [2])]),
        v2("too many ints", [e2, e1], [("n", np.zeros(2, i64), [2])]),
        v2("dense of the wrong type", [e1, e3], [("age", np.array([0], i64), [1])]),
        v2("int64 read as float", [e1], [("age", np.array([0.0], f32), [1])]),
        v2("sparse of the wrong type", [e1, e3], [], [("age", tf.int64)]),
        v2("not a multiple of the stride", [e1, e2], [("w", np.float32(0), [-1, 2])]),
        v2("corrupt", [e1, b"garbage!"], [("age", np.array([0], i64), [1])]),
        v2("a default of the wrong shape", [e1], [("w", np.zeros(2, f32), [3])]),
        v2("a scalar default for a vector", [e1], [("w", np.float32(0), [3])]),
        v2("matrix input", [[e1]], [("age", np.array([0], i64), [1])]),
        v2("names of the wrong shape", [e1, e2], [("age", np.array([0], i64), [1])],
           names=["a"]),
        v2("ragged", [e1], [], [], ragged=["tags"]),
        single("dense and sparse", e1, [("age", np.array([-1], i64), [1]),
                                        ("w", np.zeros(3, f32), [3])],
               [("tags", tf.string), ("n", tf.int64)]),
        single("defaults", e2, [("n", np.array([7, 8], i64), [2])], [("w", tf.float32)]),
        single("required and missing", e2, [("n", np.zeros([0], i64), [2])]),
        single("too many values", e1, [("w", np.zeros(2, f32), [2])]),
        single("too few values", e3, [("w", np.zeros(3, f32), [3])]),
        single("too few strings", e2, [("tags", np.array([b"", b""], object), [2])]),
        single("wrong type", e3, [("age", np.array([-1], i64), [1])]),
        single("corrupt", b"garbage!", [("age", np.array([-1], i64), [1])]),
        single("a vector", [e1], [("age", np.array([-1], i64), [1])]),
    ]


def parse_sequences():
    """tf.io.parse_example with FixedLenSequenceFeature, whose dense shape has an unknown
    first dimension (the raw op's Python wrapper refuses -1): dense keys, defaults and
    shapes as the op sees them, and the values."""
    e1 = example(w=floats([1.0, 2.0, 3.0]), n=ints([1, 2, 3, 4]))
    e2 = example(w=floats([1.0]))
    spec = {"w": tf.io.FixedLenSequenceFeature([], tf.float32, allow_missing=True,
                                               default_value=-1.0),
            "n": tf.io.FixedLenSequenceFeature([2], tf.int64, allow_missing=True)}
    got = tf.io.parse_example([e1, e2, example()], spec)
    one = tf.io.parse_single_example(e1, spec)
    errors = []
    for ser in [[e1, e2], e1]:
        try:
            tf.io.parse_example(ser, {"w": tf.io.FixedLenSequenceFeature(
                [2], tf.float32, allow_missing=True)})
        except tf.errors.OpError as e:
            errors.append(dict(code=CODES[type(e)], message=tf_message(e)))
    return dict(examples=[e.hex() for e in [e1, e2, example()]], single=e1.hex(),
                n=encode(got["n"].numpy()), w=encode(got["w"].numpy()),
                single_n=encode(one["n"].numpy()), single_w=encode(one["w"].numpy()),
                errors=errors)


def io_cases():
    return [
        case("print passes its input", "Print", [np.array([1, 2], np.int32),
                                                 [np.arange(10).reshape(2, 5), ["a", "b"],
                                                  np.float32(1.5)]],
             message="msg: ", summarize=3),
        case("print a vector", "PrintV2", [["a", "b"]]),
        case("print to an unknown stream", "PrintV2", ["a"], output_stream="foo"),
        case("read a vector", "ReadFile", [["a"]]),
        case("write to a vector", "WriteFile", [["a"], "x"]),
        case("write a vector", "WriteFile", ["/nonexistent/a", ["x"]]),
    ]


def main():
    cases = (split_cases() + substr_cases() + regex_cases() + simple_cases()
             + as_string_cases() + format_cases() + decode_raw_cases() + number_cases()
             + csv_cases() + parse_cases() + io_cases())
    print(json.dumps(dict(cases=cases, sequences=parse_sequences())))


if __name__ == "__main__":
    main()
