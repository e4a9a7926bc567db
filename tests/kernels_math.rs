//! Element-wise math, AddN, Cast and matrix products, against values worked out by hand.

use crate::kernels_support::*;
use tessera::error::Code;
use tessera::tensor::DType;

#[test]
fn add_broadcasts_rows_and_columns() {
    // [[1,2,3],[4,5,6]] + [10,20,30]
    let out = run1(
        node("AddV2").t(DType::Float),
        vec![
            f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]),
            f32s(&[3], &[10., 20., 30.]),
        ],
    );
    assert_f32(&out, &[2, 3], &[11., 22., 33., 14., 25., 36.], 0.0);
    // column [2,1] + row [1,3] -> [2,3]: out[i][j] = col[i] + row[j]
    let out = run1(
        node("Add").t(DType::Int32),
        vec![i32s(&[2, 1], &[100, 200]), i32s(&[1, 3], &[1, 2, 3])],
    );
    assert_exact(&out, &[2, 3], &[101, 102, 103, 201, 202, 203]);
    // a scalar on either side
    let out = run1(
        node("Sub").t(DType::Int64),
        vec![i64s(&[], &[10]), i64s(&[3], &[1, 2, 3])],
    );
    assert_exact(&out, &[3], &[9i64, 8, 7]);
    let out = run1(
        node("Mul").t(DType::Double),
        vec![f64s(&[2], &[1.5, -2.0]), f64s(&[], &[4.0])],
    );
    assert_f64(&out, &[2], &[6.0, -8.0], 0.0);
}

#[test]
fn incompatible_shapes_name_the_node_and_both_shapes() {
    let msg = expect_err(
        node("AddV2").t(DType::Float),
        vec![f32s(&[2, 3], &[0.; 6]), f32s(&[4], &[0.; 4])],
        Code::InvalidArgument,
        "Incompatible shapes: [2,3] vs. [4]",
    );
    assert!(msg.starts_with("node `x` (op AddV2)"), "{msg}");
}

#[test]
fn mismatched_and_unsupported_dtypes_are_invalid_arguments() {
    expect_err(
        node("AddV2"),
        vec![f32s(&[1], &[1.]), i32s(&[1], &[1])],
        Code::InvalidArgument,
        "different dtypes",
    );
    expect_err(
        node("Mul"),
        vec![bools(&[1], &[true]), bools(&[1], &[true])],
        Code::InvalidArgument,
        "bool",
    );
    expect_err(
        node("Sqrt"),
        vec![i32s(&[1], &[4])],
        Code::InvalidArgument,
        "float32, float64",
    );
}

#[test]
fn division_ops_follow_tensorflow() {
    let out = run1(
        node("RealDiv"),
        vec![f32s(&[2], &[1., 3.]), f32s(&[2], &[4., 2.])],
    );
    assert_f32(&out, &[2], &[0.25, 1.5], 0.0);
    // Integer RealDiv truncates toward zero; FloorDiv rounds down; FloorMod takes the divisor's sign.
    let out = run1(node("RealDiv"), vec![i32s(&[2], &[7, -7]), i32s(&[], &[2])]);
    assert_exact(&out, &[2], &[3, -3]);
    let out = run1(
        node("FloorDiv"),
        vec![i32s(&[4], &[7, -7, 7, -7]), i32s(&[4], &[2, 2, -2, -2])],
    );
    assert_exact(&out, &[4], &[3, -4, -4, 3]);
    let out = run1(
        node("FloorMod"),
        vec![i64s(&[4], &[7, -7, 7, -7]), i64s(&[4], &[3, 3, -3, -3])],
    );
    assert_exact(&out, &[4], &[1i64, 2, -2, -1]);
    let out = run1(
        node("FloorMod"),
        vec![f32s(&[2], &[-1.5, 5.5]), f32s(&[], &[2.])],
    );
    assert_f32(&out, &[2], &[0.5, 1.5], 0.0);
    let out = run1(
        node("FloorDiv"),
        vec![f64s(&[2], &[-7., 7.]), f64s(&[], &[2.])],
    );
    assert_f64(&out, &[2], &[-4., 3.], 0.0);
}

#[test]
fn integer_division_by_zero_is_an_error_not_a_panic() {
    for op in ["RealDiv", "FloorDiv", "FloorMod"] {
        expect_err(
            node(op),
            vec![i32s(&[2], &[1, 2]), i32s(&[2], &[1, 0])],
            Code::InvalidArgument,
            "Integer division by zero",
        );
        expect_err(
            node(op),
            vec![i64s(&[1], &[1]), i64s(&[], &[0])],
            Code::InvalidArgument,
            "Integer division by zero",
        );
    }
    // Float division by zero is IEEE: inf.
    let out = run1(node("RealDiv"), vec![f32s(&[1], &[1.]), f32s(&[1], &[0.])]);
    assert!(out.values::<f32>().unwrap()[0].is_infinite());
}

#[test]
fn pow_maximum_minimum() {
    let out = run1(
        node("Pow"),
        vec![f32s(&[3], &[2., 9., 4.]), f32s(&[3], &[3., 0.5, -1.])],
    );
    assert_f32(&out, &[3], &[8., 3., 0.25], 1e-6);
    let out = run1(node("Pow"), vec![i32s(&[3], &[2, -3, 5]), i32s(&[], &[3])]);
    assert_exact(&out, &[3], &[8, -27, 125]);
    expect_err(
        node("Pow"),
        vec![i32s(&[1], &[2]), i32s(&[1], &[-1])],
        Code::InvalidArgument,
        "negative integer powers",
    );
    let out = run1(
        node("Maximum"),
        vec![i32s(&[3], &[1, 5, -2]), i32s(&[], &[0])],
    );
    assert_exact(&out, &[3], &[1, 5, 0]);
    let out = run1(
        node("Minimum"),
        vec![f64s(&[2, 1], &[1., 4.]), f64s(&[2], &[2., 3.])],
    );
    assert_f64(&out, &[2, 2], &[1., 1., 2., 3.], 0.0);
}

#[test]
fn unary_ops_match_closed_forms() {
    let x = [0.25f64, 1.0, 4.0];
    let t = f32s(&[3], &[0.25, 1.0, 4.0]);
    type Case = (&'static str, fn(f64) -> f64);
    let cases: [Case; 7] = [
        ("Sqrt", f64::sqrt),
        ("Rsqrt", |v| 1.0 / v.sqrt()),
        ("Exp", f64::exp),
        ("Log", f64::ln),
        ("Reciprocal", |v| 1.0 / v),
        ("Square", |v| v * v),
        ("Neg", |v| -v),
    ];
    for (op, f) in cases {
        let out = run1(node(op), vec![t.clone()]);
        let expected: Vec<f64> = x.iter().map(|&v| f(v)).collect();
        assert_f32(&out, &[3], &expected, 1e-5);
    }
    let out = run1(node("Abs"), vec![i32s(&[3], &[-3, 0, 2])]);
    assert_exact(&out, &[3], &[3, 0, 2]);
    let out = run1(node("Sign"), vec![f64s(&[3], &[-3.5, 0.0, 2.0])]);
    assert_f64(&out, &[3], &[-1., 0., 1.], 0.0);
    let out = run1(node("Square"), vec![i64s(&[2], &[-3, 4])]);
    assert_exact(&out, &[2], &[9i64, 16]);
}

#[test]
fn add_n_sums_same_shape_inputs() {
    let out = run1(
        node("AddN"),
        vec![
            f32s(&[2], &[1., 2.]),
            f32s(&[2], &[10., 20.]),
            f32s(&[2], &[100., 200.]),
        ],
    );
    assert_f32(&out, &[2], &[111., 222.], 0.0);
    expect_err(
        node("AddN"),
        vec![f32s(&[2], &[1., 2.]), f32s(&[3], &[1., 2., 3.])],
        Code::InvalidArgument,
        "same dtype, size and shape",
    );
}

#[test]
fn cast_between_numbers_and_bools() {
    let cast = |dst: DType| node("Cast").attr("DstT", value::dtype(dst));
    let out = run1(cast(DType::Int32), vec![f32s(&[4], &[1.9, -1.9, 0.0, 3.0])]);
    assert_exact(&out, &[4], &[1, -1, 0, 3]);
    let out = run1(cast(DType::Bool), vec![i64s(&[3], &[0, 5, -1])]);
    assert_exact(&out, &[3], &[false, true, true]);
    let out = run1(cast(DType::Float), vec![bools(&[2], &[true, false])]);
    assert_f32(&out, &[2], &[1., 0.], 0.0);
    let out = run1(cast(DType::Double), vec![i32s(&[2], &[7, -2])]);
    assert_f64(&out, &[2], &[7., -2.], 0.0);
    let out = run1(cast(DType::Int64), vec![i32s(&[1], &[-5])]);
    assert_exact(&out, &[1], &[-5i64]);
    let wrong_src = cast(DType::Float).attr("SrcT", value::dtype(DType::Int64));
    expect_err(
        wrong_src,
        vec![i32s(&[1], &[1])],
        Code::InvalidArgument,
        "SrcT",
    );
}

#[test]
fn matmul_with_transposes() {
    // a = [[1,2,3],[4,5,6]], b = [[7,8],[9,10],[11,12]]
    // a@b = [[1*7+2*9+3*11, 1*8+2*10+3*12], [4*7+5*9+6*11, 4*8+5*10+6*12]] = [[58,64],[139,154]]
    let a = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = f32s(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    let out = run1(node("MatMul"), vec![a.clone(), b.clone()]);
    assert_f32(&out, &[2, 2], &[58., 64., 139., 154.], 0.0);
    // a^T (3x2) @ a (2x3) = [[17,22,27],[22,29,36],[27,36,45]]
    let out = run1(
        node("MatMul").attr("transpose_a", value::bool(true)),
        vec![a.clone(), a.clone()],
    );
    assert_f32(
        &out,
        &[3, 3],
        &[17., 22., 27., 22., 29., 36., 27., 36., 45.],
        0.0,
    );
    // a (2x3) @ a^T (3x2) = [[14,32],[32,77]]
    let out = run1(
        node("MatMul").attr("transpose_b", value::bool(true)),
        vec![a.clone(), a.clone()],
    );
    assert_f32(&out, &[2, 2], &[14., 32., 32., 77.], 0.0);
    // int32 works too
    let out = run1(
        node("MatMul"),
        vec![i32s(&[1, 2], &[2, 3]), i32s(&[2, 1], &[4, 5])],
    );
    assert_exact(&out, &[1, 1], &[23]);
    expect_err(
        node("MatMul"),
        vec![a.clone(), a.clone()],
        Code::InvalidArgument,
        "Matrix size-incompatible: In[0]: [2,3], In[1]: [2,3]",
    );
    expect_err(
        node("MatMul"),
        vec![f32s(&[3], &[1., 2., 3.]), b],
        Code::InvalidArgument,
        "In[0] is not a matrix",
    );
}

#[test]
fn batch_matmul_broadcasts_batch_dimensions() {
    // x: 2 batches of 2x2 (identity, and 2*identity); y: one 2x2 [[1,2],[3,4]] broadcast.
    let x = f32s(&[2, 2, 2], &[1., 0., 0., 1., 2., 0., 0., 2.]);
    let y = f32s(&[1, 2, 2], &[1., 2., 3., 4.]);
    let out = run1(node("BatchMatMulV2"), vec![x.clone(), y.clone()]);
    assert_f32(&out, &[2, 2, 2], &[1., 2., 3., 4., 2., 4., 6., 8.], 0.0);
    // adj_y: y^T = [[1,3],[2,4]]
    let out = run1(
        node("BatchMatMulV2").attr("adj_y", value::bool(true)),
        vec![x.clone(), y.clone()],
    );
    assert_f32(&out, &[2, 2, 2], &[1., 3., 2., 4., 2., 6., 4., 8.], 0.0);
    // adj_x on a [1,2,3] x: x^T (3x2) @ [2,1] -> [1,3,1]; x = [[1,2,3],[4,5,6]], v = [1,1] -> [5,7,9]
    let out = run1(
        node("BatchMatMulV2").attr("adj_x", value::bool(true)),
        vec![
            f64s(&[1, 2, 3], &[1., 2., 3., 4., 5., 6.]),
            f64s(&[2, 1], &[1., 1.]),
        ],
    );
    assert_f64(&out, &[1, 3, 1], &[5., 7., 9.], 0.0);
    expect_err(
        node("BatchMatMulV2"),
        vec![f32s(&[2, 2, 2], &[0.; 8]), f32s(&[3, 2, 2], &[0.; 12])],
        Code::InvalidArgument,
        "batch dimensions",
    );
    expect_err(
        node("BatchMatMulV2"),
        vec![f32s(&[2, 3], &[0.; 6]), f32s(&[2, 3], &[0.; 6])],
        Code::InvalidArgument,
        "Matrix size-incompatible",
    );
}

#[test]
fn unknown_ops_are_unimplemented() {
    expect_err(
        node("NoSuchOp"),
        vec![],
        Code::Unimplemented,
        "no CPU kernel for op NoSuchOp",
    );
}
