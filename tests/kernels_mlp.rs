//! One training step of a tiny MLP (the model of the golden graphs: matmul, bias, relu, sparse
//! softmax cross-entropy, mean, then Adagrad) chained through the kernels, against the same step
//! written out with plain f64 loops.

use crate::kernels_support::*;
use tessera::runtime::resource::ResourceMgr;
use tessera::tensor::{DType, Tensor};

// Row 0 activates both hidden units, row 1 only the first, so ReluGrad masks one.
const X: [[f64; 3]; 2] = [[1.0, 2.0, 0.5], [0.3, 0.8, -1.0]];
const W1: [[f64; 2]; 3] = [[0.2, -0.5], [0.1, 0.4], [-0.3, 0.6]];
const B1: [f64; 2] = [0.05, -0.1];
const W2: [[f64; 2]; 2] = [[0.7, -0.2], [-0.4, 0.9]];
const B2: [f64; 2] = [0.0, 0.1];
const LABELS: [usize; 2] = [1, 0];
const LR: f64 = 0.1;
const ACCUM0: f64 = 0.1;

fn flat<const N: usize, const M: usize>(m: &[[f64; M]; N]) -> Vec<f64> {
    m.iter().flatten().copied().collect()
}

/// The step by hand: returns (loss, new w1).
fn reference() -> (f64, Vec<f64>) {
    let (b, i_n, h_n, o_n) = (2, 3, 2, 2);
    let mut h_pre = vec![vec![0.0; h_n]; b];
    for r in 0..b {
        for j in 0..h_n {
            h_pre[r][j] = B1[j] + (0..i_n).map(|k| X[r][k] * W1[k][j]).sum::<f64>();
        }
    }
    let h: Vec<Vec<f64>> = h_pre
        .iter()
        .map(|row| row.iter().map(|v| v.max(0.0)).collect())
        .collect();
    let mut loss = 0.0;
    let mut dlogits = vec![vec![0.0; o_n]; b];
    for r in 0..b {
        let logits: Vec<f64> = (0..o_n)
            .map(|j| B2[j] + (0..h_n).map(|k| h[r][k] * W2[k][j]).sum::<f64>())
            .collect();
        let z: f64 = logits.iter().map(|v| v.exp()).sum();
        loss += -(logits[LABELS[r]].exp() / z).ln() / b as f64;
        for j in 0..o_n {
            let onehot = if j == LABELS[r] { 1.0 } else { 0.0 };
            dlogits[r][j] = (logits[j].exp() / z - onehot) / b as f64;
        }
    }
    let mut new_w1 = Vec::new();
    for k in 0..i_n {
        for j in 0..h_n {
            // dh[r][j] = sum_o dlogits[r][o] * W2[j][o], passed where h_pre > 0
            let g: f64 = (0..b)
                .map(|r| {
                    let dh: f64 = (0..o_n).map(|o| dlogits[r][o] * W2[j][o]).sum();
                    X[r][k] * if h_pre[r][j] > 0.0 { dh } else { 0.0 }
                })
                .sum();
            let accum = ACCUM0 + g * g;
            new_w1.push(W1[k][j] - LR * g / accum.sqrt());
        }
    }
    (loss, new_w1)
}

fn t64(dims: &[usize], values: Vec<f64>) -> Tensor {
    f64s(dims, &values)
}

fn call(op: &str, attrs: &[(&str, bool)], inputs: Vec<Tensor>) -> Vec<Tensor> {
    let b = attrs
        .iter()
        .fold(node(op), |b, &(k, v)| b.attr(k, value::bool(v)));
    b.run(inputs).unwrap_or_else(|e| panic!("{op}: {e}"))
}

#[test]
fn one_adagrad_step_matches_the_hand_written_step() {
    let x = t64(&[2, 3], flat(&X));
    let w1 = t64(&[3, 2], flat(&W1));
    let w2 = t64(&[2, 2], flat(&W2));
    let axis0 = ivec(&[0]);

    // forward
    let h_pre = call(
        "AddV2",
        &[],
        vec![
            call("MatMul", &[], vec![x.clone(), w1.clone()]).remove(0),
            t64(&[2], B1.to_vec()),
        ],
    )
    .remove(0);
    let h = call("Relu", &[], vec![h_pre.clone()]).remove(0);
    let logits = call(
        "BiasAdd",
        &[],
        vec![
            call("MatMul", &[], vec![h.clone(), w2.clone()]).remove(0),
            t64(&[2], B2.to_vec()),
        ],
    )
    .remove(0);
    let labels = i64s(&[2], &LABELS.map(|l| l as i64));
    let xent = call(
        "SparseSoftmaxCrossEntropyWithLogits",
        &[],
        vec![logits, labels],
    );
    let loss = call("Mean", &[], vec![xent[0].clone(), axis0.clone()]).remove(0);

    // backward: d(mean)/d(loss_i) = 1/batch
    let scale = call("RealDiv", &[], vec![f64s(&[], &[1.0]), f64s(&[], &[2.0])]).remove(0);
    let dlogits = call("Mul", &[], vec![xent[1].clone(), scale]).remove(0);
    let dh = call("MatMul", &[("transpose_b", true)], vec![dlogits, w2]).remove(0);
    let dh_pre = call("ReluGrad", &[], vec![dh, h_pre]).remove(0);
    let dw1 = call("MatMul", &[("transpose_a", true)], vec![x, dh_pre]).remove(0);

    // apply Adagrad to w1 held in a variable
    let rm = ResourceMgr::new();
    let handle = |name: &str| {
        let n = node("VarHandleOp")
            .name(name)
            .attr("dtype", value::dtype(DType::Double))
            .build();
        run_with(&n, vec![], &rm).unwrap().remove(0)
    };
    let (w1_h, accum_h) = (handle("w1"), handle("w1/Adagrad"));
    let assign = node("AssignVariableOp")
        .attr("dtype", value::dtype(DType::Double))
        .build();
    run_with(&assign, vec![w1_h.clone(), w1], &rm).unwrap();
    run_with(
        &assign,
        vec![accum_h.clone(), t64(&[3, 2], vec![ACCUM0; 6])],
        &rm,
    )
    .unwrap();
    let adagrad = node("ResourceApplyAdagrad").build();
    run_with(
        &adagrad,
        vec![w1_h.clone(), accum_h, f64s(&[], &[LR]), dw1],
        &rm,
    )
    .unwrap();
    let read = node("ReadVariableOp")
        .attr("dtype", value::dtype(DType::Double))
        .build();
    let new_w1 = run_with(&read, vec![w1_h], &rm).unwrap().remove(0);

    let (expected_loss, expected_w1) = reference();
    assert_f64(&loss, &[], &[expected_loss], 1e-12);
    assert_f64(&new_w1, &[3, 2], &expected_w1, 1e-12);
}
