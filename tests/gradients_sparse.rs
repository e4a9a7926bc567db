//! The gradients of the embedding ops (gathers on any axis with batch dimensions, segment
//! reductions, sparse segment reductions, DynamicPartition, DynamicStitch) checked against
//! central finite differences, and a `ResourceGather`'s gradient on a variable worked out by
//! hand.
//!
//! The check is `tests/support/finite_differences.rs`, the one `tests/gradients.rs` uses.

use crate::support::finite_differences::{check, inp, positive, unknown_dims};
use tessera::client::Session;
use tessera::graph::{gradients, Graph, Output};
use tessera::tensor::{DType, PartialShape, Tensor};

fn ints(g: &mut Graph, dims: &[usize], v: &[i64]) -> Output {
    g.constant(&Tensor::from_vec(dims.to_vec(), v.to_vec()).unwrap())
        .unwrap()
}

fn ints32(g: &mut Graph, dims: &[usize], v: &[i32]) -> Output {
    g.const_i32("Const", dims, v).unwrap()
}

#[test]
fn gathers_on_every_axis_with_batch_dims() {
    // params [3,4,2]; (axis, batch_dims, indices shape, indices).
    let cases: Vec<(i64, i64, Vec<usize>, Vec<i64>)> = vec![
        (0, 0, vec![4], vec![2, 0, 2, 1]),
        (1, 0, vec![2, 2], vec![3, 0, 3, 3]),
        (2, 0, vec![3], vec![1, 1, 0]),
        (-1, 0, vec![1], vec![1]),
        (1, 1, vec![3, 2], vec![0, 3, 2, 2, 1, 0]),
        (2, 1, vec![3, 2], vec![1, 0, 0, 0, 1, 1]),
        (
            2,
            2,
            vec![3, 4, 2],
            (0..24).map(|k| (k * 7 % 5 % 2) as i64).collect(),
        ),
        (1, -1, vec![3, 3], vec![0, 1, 1, 3, 3, 3, 2, 0, 1]),
    ];
    for (axis, batch_dims, dims, idx) in cases {
        let name = format!("GatherV2 axis {axis} batch_dims {batch_dims}");
        for params in [inp(&[3, 4, 2]), unknown_dims(&[3, 4, 2])] {
            check(&name, vec![params], &|g, x| {
                let i = ints(g, &dims, &idx);
                g.gather_batch(&x[0], &i, axis, batch_dims)
            });
        }
    }
}

#[test]
fn unsorted_segment_reductions() {
    for op in [
        "UnsortedSegmentSum",
        "UnsortedSegmentMax",
        "UnsortedSegmentMin",
        "UnsortedSegmentProd",
    ] {
        check(op, vec![positive(&[6, 2])], &|g, x| {
            // A negative id drops its row; segment 3 stays empty (held at its identity, which
            // gets no gradient since no input reaches it).
            let ids = ints32(g, &[6], &[2, 0, -1, 2, 4, 0]);
            let n = g.const_i32("Const", &[], &[5])?;
            let y = g.unsorted_segment(op, &x[0], &ids, &n)?;
            // Rows 1 and 3 hold no input; leave them out so the identity (±max for Max/Min)
            // does not swamp the loss.
            let keep = ints32(g, &[3], &[0, 2, 4]);
            g.gather(&y, &keep, 0)
        });
        check(
            &format!("{op} 2-D ids"),
            vec![positive(&[2, 3, 2])],
            &|g, x| {
                let ids = ints(g, &[2, 3], &[1, 0, 1, -1, 2, 1]);
                let n = g.const_i32("Const", &[], &[3])?;
                g.unsorted_segment(op, &x[0], &ids, &n)
            },
        );
    }
}

#[test]
fn sorted_segment_reductions() {
    for op in [
        "SegmentSum",
        "SegmentMean",
        "SegmentMax",
        "SegmentMin",
        "SegmentProd",
    ] {
        check(op, vec![positive(&[7, 2])], &|g, x| {
            let ids = ints32(g, &[7], &[0, 0, 2, 2, 2, 3, 5]);
            g.segment(op, &x[0], &ids)
        });
    }
}

#[test]
fn sparse_segment_reductions() {
    for op in [
        "SparseSegmentSum",
        "SparseSegmentMean",
        "SparseSegmentSqrtN",
    ] {
        for with_num in [false, true] {
            let name = format!("{op} num_segments {with_num}");
            check(&name, vec![inp(&[6, 3])], &|g, x| {
                let indices = ints32(g, &[5], &[5, 0, 5, 2, 1]);
                let ids = ints32(g, &[5], &[0, 0, 2, 2, 3]);
                let n = g.const_i32("Const", &[], &[6])?;
                g.sparse_segment(op, &x[0], &indices, &ids, with_num.then_some(&n))
            });
        }
    }
}

#[test]
fn partitions_and_stitches() {
    check("DynamicPartition", vec![inp(&[6, 2])], &|g, x| {
        let p = ints32(g, &[6], &[2, 0, 2, 1, 0, 2]);
        let parts = g.dynamic_partition(&x[0], &p, 3)?;
        // Partition 1 reaches the loss through no path: its gradient is zeros.
        g.concat(&[parts[0].clone(), parts[2].clone()], 0)
    });
    check("DynamicPartition 2-D", vec![inp(&[2, 3, 2])], &|g, x| {
        let p = ints32(g, &[2, 3], &[1, 0, 1, 1, 1, 0]);
        let parts = g.dynamic_partition(&x[0], &p, 2)?;
        g.concat(&parts, 0)
    });
    for parallel in [false, true] {
        let name = format!("DynamicStitch parallel {parallel}");
        check(&name, vec![inp(&[2, 3]), inp(&[2, 2, 3])], &|g, x| {
            let i0 = ints32(g, &[2], &[0, 4]);
            let i1 = ints32(g, &[2, 2], &[1, 6, 5, 2]);
            g.dynamic_stitch(&[i0, i1], &[x[0].clone(), x[1].clone()], parallel)
        });
    }
}

#[test]
fn resource_gather_gradient_sums_the_rows_it_read() {
    let mut g = Graph::new();
    let init = g
        .constant(&Tensor::from_vec([4, 2], (0..8).map(f64::from).collect()).unwrap())
        .unwrap();
    let v = g.variable("table", &init).unwrap();
    let idx = ints32(&mut g, &[3], &[3, 1, 3]);
    let rows = g
        .resource_gather(&v.handle, &idx, DType::Double, 0)
        .unwrap();
    assert_eq!(rows.shape.to_string(), "[3,2]");
    let w = g
        .constant(&Tensor::from_vec([3, 2], vec![1.0f64, 2., 3., 4., 5., 6.]).unwrap())
        .unwrap();
    let yw = g.mul(&rows, &w).unwrap();
    let loss = g.sum(&yw, &[0, 1], false).unwrap();
    let grad = gradients(&mut g, &[loss], std::slice::from_ref(&v.handle), None)
        .unwrap()
        .remove(0)
        .unwrap();
    let init_op = g.global_variables_initializer().unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init_op]).unwrap();
    let out = session
        .run(&[], &[&grad.name(), &rows.name()], &[])
        .unwrap();
    // Row 3 was read twice: its gradient is the sum of both weights' rows.
    assert_eq!(
        out[0].values::<f64>().unwrap().as_ref(),
        &[0., 0., 3., 4., 0., 0., 6., 8.]
    );
    assert_eq!(
        out[1].values::<f64>().unwrap().as_ref(),
        &[6., 7., 2., 3., 6., 7.]
    );
}

/// An embedding table read through both kinds of gather, and a dense weight: the table's
/// gradient comes back as the rows read, equal once densified to the dense gradient, and a
/// gradient-descent step through `ResourceScatterAdd` moves only those rows.
#[test]
fn sparse_gradients_give_the_rows_a_gather_read() {
    use tessera::graph::{sparse_gradients, GradientTensor};

    let mut g = Graph::new();
    let init = g
        .constant(&Tensor::from_vec([6, 2], (0..12).map(|v| v as f32).collect()).unwrap())
        .unwrap();
    let table = g.variable("table", &init).unwrap();
    let w0 = g
        .constant(&Tensor::from_vec([2, 1], vec![1.0f32, -2.0]).unwrap())
        .unwrap();
    let w = g.variable("w", &w0).unwrap();
    let ids = g
        .placeholder("ids", DType::Int64, PartialShape::new(vec![None]))
        .unwrap();
    let read = g.read_variable(&table.handle).unwrap();
    let rows = g.gather(&read, &ids, 0).unwrap();
    let more = ints32(&mut g, &[2], &[5, 1]);
    let rows2 = g
        .resource_gather(&table.handle, &more, DType::Float, 0)
        .unwrap();
    let both = g.concat(&[rows, rows2], 0).unwrap();
    let wr = g.read_variable(&w.handle).unwrap();
    let logits = g.matmul(&both, &wr).unwrap();
    let sq = g.unary("Square", &logits).unwrap();
    let loss = g.sum(&sq, &[0, 1], false).unwrap();
    let xs = [table.handle.clone(), w.handle.clone()];
    let sparse = sparse_gradients(&mut g, std::slice::from_ref(&loss), &xs, None).unwrap();
    let Some(GradientTensor::Slices(slices)) = &sparse[0] else {
        panic!("the table's gradient should be slices: {:?}", sparse[0]);
    };
    let Some(GradientTensor::Dense(dw)) = &sparse[1] else {
        panic!("w's gradient should be dense: {:?}", sparse[1]);
    };
    let slices = slices.clone();
    let deduplicated = slices.deduplicated(&mut g).unwrap();
    let from_slices = slices.to_dense(&mut g).unwrap();
    let dense = gradients(&mut g, std::slice::from_ref(&loss), &xs, None).unwrap();
    let lr = g.scalar("lr", DType::Float, 0.1).unwrap();
    let step = g.mul(&slices.values, &lr).unwrap();
    let minus = g.unary("Neg", &step).unwrap();
    let train = g
        .resource_scatter("ResourceScatterAdd", &table.handle, &slices.indices, &minus)
        .unwrap();
    let init_op = g.global_variables_initializer().unwrap();

    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init_op]).unwrap();
    let feed = [("ids:0", Tensor::from_vec([3], vec![2i64, 0, 2]).unwrap())];
    let fetch = [
        slices.indices.name(),
        slices.values.name(),
        from_slices.name(),
        dense[0].as_ref().unwrap().name(),
        dw.name(),
        dense[1].as_ref().unwrap().name(),
        deduplicated.indices.name(),
        deduplicated.values.name(),
    ];
    let fetch: Vec<&str> = fetch.iter().map(String::as_str).collect();
    let out = session.run(&feed, &fetch, &[]).unwrap();
    // The indices of both gathers, in order, as int64 (one of them was int32).
    assert_eq!(out[0].values::<i64>().unwrap().as_ref(), &[2, 0, 2, 5, 1]);
    assert_eq!(out[1].dims(), &[5, 2]);
    assert_eq!(
        out[2].values::<f32>().unwrap(),
        out[3].values::<f32>().unwrap()
    );
    assert_eq!(
        out[4].values::<f32>().unwrap(),
        out[5].values::<f32>().unwrap()
    );
    // Row 2, read twice, is one row of the deduplicated slices holding both gradients.
    assert_eq!(out[6].values::<i64>().unwrap().as_ref(), &[2, 0, 5, 1]);
    let v = out[1].values::<f32>().unwrap();
    let d = out[7].values::<f32>().unwrap();
    assert_eq!(&d[..2], &[v[0] + v[4], v[1] + v[5]]);

    let before = session.run(&[], &[&table.value.name()], &[]).unwrap()[0]
        .values::<f32>()
        .unwrap()
        .into_owned();
    session.run(&feed, &[], &[&train]).unwrap();
    let after = session.run(&[], &[&table.value.name()], &[]).unwrap()[0]
        .values::<f32>()
        .unwrap()
        .into_owned();
    let dense_grad = out[3].values::<f32>().unwrap();
    for row in 0..6 {
        for j in 0..2 {
            let k = row * 2 + j;
            let want = before[k] - 0.1 * dense_grad[k];
            assert!(
                (after[k] - want).abs() < 1e-4,
                "row {row}: {} vs {want}",
                after[k]
            );
            if [3, 4].contains(&row) {
                assert_eq!(
                    after[k], before[k],
                    "row {row} was not read and must not move"
                );
            }
        }
    }
}

/// A reference variable (`VariableV2`, read through its `Identity`) gathered from gets slices
/// too, equal once densified to the dense gradient.
#[test]
fn sparse_gradients_of_a_reference_variable() {
    use tessera::graph::{sparse_gradients, GradientTensor, VariableKind};

    let mut g = Graph::new();
    g.set_variable_kind(VariableKind::Reference);
    let init = g
        .constant(&Tensor::from_vec([5, 2], (0..10).map(f64::from).collect()).unwrap())
        .unwrap();
    let table = g.variable("table", &init).unwrap();
    let ids = ints32(&mut g, &[3], &[4, 0, 4]);
    let rows = g.gather(&table.value, &ids, 0).unwrap();
    let sq = g.unary("Square", &rows).unwrap();
    let loss = g.sum(&sq, &[0, 1], false).unwrap();
    let xs = [table.handle.clone()];
    let sparse = sparse_gradients(&mut g, std::slice::from_ref(&loss), &xs, None).unwrap();
    let Some(GradientTensor::Slices(slices)) = sparse[0].clone() else {
        panic!("the table's gradient should be slices: {:?}", sparse[0]);
    };
    let from_slices = slices.to_dense(&mut g).unwrap();
    let dense = gradients(&mut g, std::slice::from_ref(&loss), &xs, None).unwrap();
    let init_op = g.global_variables_initializer().unwrap();
    let session = Session::local();
    session.extend(&g.to_graph_def()).unwrap();
    session.run(&[], &[], &[&init_op]).unwrap();
    let out = session
        .run(
            &[],
            &[
                &slices.indices.name(),
                &from_slices.name(),
                &dense[0].as_ref().unwrap().name(),
            ],
            &[],
        )
        .unwrap();
    assert_eq!(out[0].values::<i32>().unwrap().as_ref(), &[4, 0, 4]);
    // d/dx sum(x^2) at row 4 = (8, 9), read twice; at row 0 = (0, 1).
    let want = [0., 2., 0., 0., 0., 0., 0., 0., 32., 36.];
    assert_eq!(out[1].values::<f64>().unwrap().as_ref(), &want);
    assert_eq!(out[2].values::<f64>().unwrap().as_ref(), &want);
}

#[test]
fn embedding_lookup_reads_a_partitioned_tables_rows_by_either_strategy() {
    use tessera::graph::{fixed_size_partitioner, PartitionStrategy};
    // A 10 x 2 table in 3 parts (4, 3, 3 rows): row r holds (r, -r).
    let table: Vec<f32> = (0..10).flat_map(|r| [r as f32, -(r as f32)]).collect();
    let ids = [[7i64, 0, 9], [3, 3, 5]];
    for strategy in [PartitionStrategy::Mod, PartitionStrategy::Div] {
        let mut g = Graph::new();
        let init = g
            .constant(&Tensor::from_vec([10, 2], table.clone()).unwrap())
            .unwrap();
        let params = g
            .partitioned_variable("table", &init, &fixed_size_partitioner(3, 0))
            .unwrap();
        let id_values: Vec<i64> = ids.iter().flatten().copied().collect();
        let id_tensor = ints(&mut g, &[2, 3], &id_values);
        let rows = g.embedding_lookup(&params, &id_tensor, strategy).unwrap();
        let session = Session::local();
        session.extend(&g.to_graph_def()).unwrap();
        let inits: Vec<String> = params.initializers();
        let inits: Vec<&str> = inits.iter().map(String::as_str).collect();
        session.run(&[], &[], &inits).unwrap();
        let got = session.run(&[], &[&rows.name()], &[]).unwrap().remove(0);
        assert_eq!(got.dims(), [2, 3, 2], "{strategy:?}");
        // Which row of the whole table an id reads: under Div, the id's own; under Mod, part
        // i % 3's row i / 3, which is row offset(i % 3) + i / 3 of the whole table.
        let whole_row = |i: i64| match strategy {
            PartitionStrategy::Div => i,
            PartitionStrategy::Mod => [0, 4, 7][(i % 3) as usize] + i / 3,
        };
        let want: Vec<f32> = id_values
            .iter()
            .flat_map(|&i| [whole_row(i) as f32, -(whole_row(i) as f32)])
            .collect();
        assert_eq!(
            got.values::<f32>().unwrap().as_ref(),
            &want[..],
            "{strategy:?}"
        );
        // Each part's gradient is the rows it gave, not a dense part.
        let loss = g.sum(&rows, &[0, 1, 2], false).unwrap();
        let handles: Vec<Output> = params.parts.iter().map(|p| p.handle.clone()).collect();
        let grads =
            tessera::graph::indexed_slices::sparse_gradients(&mut g, &[loss], &handles, None)
                .unwrap();
        for grad in grads {
            assert!(
                matches!(
                    grad,
                    Some(tessera::graph::indexed_slices::GradientTensor::Slices(_))
                ),
                "{strategy:?}: a part's gradient is dense"
            );
        }
    }
}
