//! The finite-difference gradient check the gradient tests share: the symbolic gradient of
//! `L = sum(op(x...) * W)` (`W` fixed weights, so every output element counts differently)
//! run through `Session::local()` against central differences
//! `(L(x + h e_j) - L(x - h e_j)) / 2h` computed by running the forward graph, in float64.

use tessera::client::Session;
use tessera::graph::{gradients, Graph, Output};
use tessera::tensor::{DType, PartialShape, Shape, Tensor};
use tessera::Result;

/// Deterministic values in [lo, hi) (a linear congruential sequence; the exact values do
/// not matter, only that they avoid kinks such as relu's 0 and ties in max).
pub fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// One input of a case: its dims as fed, and the dims the placeholder declares (`None` for
/// unknown, to exercise the run-time shape paths).
pub struct Input {
    pub dims: Vec<usize>,
    pub declared: Vec<Option<usize>>,
    pub lo: f64,
    pub hi: f64,
}

pub fn inp(dims: &[usize]) -> Input {
    Input {
        dims: dims.to_vec(),
        declared: dims.iter().map(|&d| Some(d)).collect(),
        lo: -1.0,
        hi: 1.0,
    }
}

pub fn positive(dims: &[usize]) -> Input {
    Input {
        lo: 0.5,
        hi: 2.0,
        ..inp(dims)
    }
}

pub fn unknown_batch(dims: &[usize]) -> Input {
    let mut i = inp(dims);
    i.declared[0] = None;
    i
}

pub type Build<'a> = dyn Fn(&mut Graph, &[Output]) -> Result<Output> + 'a;

/// Checks the gradient of `build(inputs)` with respect to every input, in float64 with step
/// 1e-6 and tolerance `1e-6 + 1e-5 |numeric|`.
pub fn check(name: &str, inputs: Vec<Input>, build: &Build<'_>) {
    check_tol(name, inputs, build, 1e-6, 1e-5);
}

/// [`check`] with step `h` and relative tolerance `rtol` (absolute tolerance `rtol / 10`), for
/// graphs that pass through float32.
pub fn check_tol(name: &str, inputs: Vec<Input>, build: &Build<'_>, h: f64, rtol: f64) {
    let mut g = Graph::new();
    let xs: Vec<Output> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            g.placeholder(
                &format!("x{i}"),
                DType::Double,
                PartialShape::new(s.declared.clone()),
            )
            .unwrap()
        })
        .collect();
    let y = build(&mut g, &xs).unwrap_or_else(|e| panic!("{name}: building the op: {e}"));
    let y = if y.dtype == DType::Double {
        y
    } else {
        g.cast(&y, DType::Double).unwrap()
    };
    let ys = g.shape(&y).unwrap();
    // Weights broadcast to y's run-time shape: W = 0.5 + (k mod 7) / 7 over y's elements.
    let n_y = 256usize;
    let w_vals: Vec<f64> = (0..n_y).map(|k| 0.5 + (k % 7) as f64 / 7.0).collect();
    let w_all = g
        .constant(&Tensor::from_vec([n_y], w_vals).unwrap())
        .unwrap();
    let size = g.unary("Size", &y).unwrap();
    let zero = g.const_i32("Const", &[1], &[0]).unwrap();
    let size1 = g.reshape_to(&size, &[1]).unwrap();
    let w_flat = g.slice(&w_all, &zero, &size1).unwrap();
    let w = g.reshape(&w_flat, &ys).unwrap();
    let yw = g.mul(&y, &w).unwrap();
    let rank = g.unary("Rank", &yw).unwrap();
    let start = g.const_i32("Const", &[], &[0]).unwrap();
    let one = g.const_i32("Const", &[], &[1]).unwrap();
    let axes = g.range(&start, &rank, &one).unwrap();
    let loss = g.reduce("Sum", &yw, &axes, false).unwrap();
    let grads = gradients(&mut g, std::slice::from_ref(&loss), &xs, None)
        .unwrap_or_else(|e| panic!("{name}: gradients: {e}"));

    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    let feeds: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let n = Shape::new(s.dims.clone()).num_elements();
            Tensor::from_vec(s.dims.clone(), values(n, 17 + i as u64, s.lo, s.hi)).unwrap()
        })
        .collect();
    let names: Vec<String> = (0..xs.len()).map(|i| format!("x{i}:0")).collect();
    let run_loss = |feeds: &[Tensor]| -> f64 {
        let f: Vec<(&str, Tensor)> = names
            .iter()
            .map(String::as_str)
            .zip(feeds.iter().cloned())
            .collect();
        let out = session
            .run(&f, &[&loss.name()], &[])
            .unwrap_or_else(|e| panic!("{name}: forward: {e}"));
        out[0].scalar_value::<f64>().unwrap()
    };
    let f: Vec<(&str, Tensor)> = names
        .iter()
        .map(String::as_str)
        .zip(feeds.iter().cloned())
        .collect();
    let fetch: Vec<String> = grads.iter().flatten().map(Output::name).collect();
    let fetch_refs: Vec<&str> = fetch.iter().map(String::as_str).collect();
    let symbolic = session
        .run(&f, &fetch_refs, &[])
        .unwrap_or_else(|e| panic!("{name}: gradient run: {e}"));
    let mut symbolic = symbolic.into_iter();
    for (i, gr) in grads.iter().enumerate() {
        let Some(_) = gr else {
            panic!("{name}: no gradient for input {i}")
        };
        let sym = symbolic.next().unwrap();
        assert_eq!(sym.dims(), feeds[i].dims(), "{name}: gradient {i} shape");
        let sym = sym.values::<f64>().unwrap().into_owned();
        let base = feeds[i].values::<f64>().unwrap().into_owned();
        for j in 0..base.len() {
            let mut plus = feeds.clone();
            let mut minus = feeds.clone();
            let mut v = base.clone();
            v[j] += h;
            plus[i] = Tensor::from_vec(feeds[i].dims().to_vec(), v.clone()).unwrap();
            v[j] -= 2.0 * h;
            minus[i] = Tensor::from_vec(feeds[i].dims().to_vec(), v).unwrap();
            let num = (run_loss(&plus) - run_loss(&minus)) / (2.0 * h);
            let err = (num - sym[j]).abs();
            assert!(
                err <= rtol / 10.0 + rtol * num.abs(),
                "{name}: d/dx{i}[{j}]: symbolic {} vs numeric {num} (error {err})",
                sym[j]
            );
        }
    }
}

/// An input whose placeholder declares no dimension at all.
pub fn unknown_dims(dims: &[usize]) -> Input {
    Input {
        declared: vec![None; dims.len()],
        ..inp(dims)
    }
}
