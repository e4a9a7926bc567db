//! What the control-flow engine (`frames.rs`) knows of a plan, computed once when the
//! executor is built: each node's while-loop frame (from the roots: an `Enter`'s successors
//! are in the frame it names, an `Exit`'s in the parent of its own), the frames' declared
//! `parallel_iterations` and `Enter` counts, per-frame pending counts and input slots, and the
//! frame ids transfers inside loops key their tensors with (TensorFlow's).

use std::collections::HashMap;

use super::{Kind, PlanNode, Source};
use crate::error::{Result, Status};
use crate::graph::attr;

/// The root frame's index among the static frames.
pub(super) const ROOT: usize = 0;

/// A while-loop frame as the graph declares it.
pub(super) struct FrameInfo {
    pub(super) name: String,
    /// The static frame of the `Enter` nodes (unused for the root).
    pub(super) parent: usize,
    pub(super) parallel_iterations: usize,
    /// The `Enter` nodes into this frame that the plan runs.
    pub(super) enters: usize,
    /// Per node of the frame (by local index): its initial pending count.
    pub(super) pending: Vec<u32>,
    /// Input slots of an iteration (every data input of every node of the frame).
    pub(super) slots: usize,
}

/// A data edge out of a node.
#[derive(Clone, Copy)]
pub(super) struct OutEdge {
    pub(super) slot: usize,
    pub(super) dst: usize,
    pub(super) input: usize,
}

/// What the control-flow engine knows of a plan, computed once.
pub(super) struct ControlPlan {
    pub(super) frames: Vec<FrameInfo>,
    /// Per node: its static frame.
    pub(super) frame_of: Vec<usize>,
    /// Per node: its index among its frame's nodes.
    pub(super) local: Vec<usize>,
    /// Per node: the first input slot of its inputs in its frame's iterations.
    pub(super) input_base: Vec<usize>,
    pub(super) data_out: Vec<Vec<OutEdge>>,
    pub(super) control_out: Vec<Vec<usize>>,
    /// Per node: its number of data inputs (a Merge is dead when all of them are).
    pub(super) data_inputs: Vec<usize>,
    /// Per `Enter` node: the static frame it enters and whether it is a loop invariant.
    pub(super) enter: Vec<Option<(usize, bool)>>,
}

impl ControlPlan {
    /// Assigns every node its frame (walking from the roots: an `Enter`'s successors are in the
    /// frame it names, an `Exit`'s in the parent of its own) and precomputes the pending
    /// counts. INVALID_ARGUMENT when a node would be in two frames, an `Exit` leaves the root
    /// frame, or a node cannot be reached from any root.
    pub(super) fn new(
        plan_nodes: &[PlanNode],
        control_inputs: &[Vec<usize>],
        roots: &[usize],
    ) -> Result<ControlPlan> {
        let n = plan_nodes.len();
        let mut data_out = vec![Vec::new(); n];
        let mut control_out = vec![Vec::new(); n];
        let mut data_inputs = vec![0; n];
        for (dst, node) in plan_nodes.iter().enumerate() {
            data_inputs[dst] = node.inputs.len();
            for (input, source) in node.inputs.iter().enumerate() {
                if let Source::Output { node: src, slot } = *source {
                    data_out[src].push(OutEdge { slot, dst, input });
                }
            }
            for &src in &control_inputs[dst] {
                control_out[src].push(dst);
            }
        }

        let mut frames = vec![FrameInfo {
            name: String::new(),
            parent: ROOT,
            parallel_iterations: 1,
            enters: 0,
            pending: Vec::new(),
            slots: 0,
        }];
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut enter = vec![None; n];
        for (i, node) in plan_nodes.iter().enumerate() {
            if node.kind != Kind::Enter {
                continue;
            }
            let def = &node.def;
            let name = attr::string_or(def, "frame_name", "")?;
            if name.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "node `{}` ({}) has no frame_name; every Enter names its while loop's frame",
                    def.name, def.op
                )));
            }
            let parallel = attr::int_or(def, "parallel_iterations", 10)?;
            if parallel < 1 {
                return Err(Status::invalid_argument(format!(
                    "node `{}` ({}): parallel_iterations is {parallel}; it must be at least 1",
                    def.name, def.op
                )));
            }
            let constant = attr::bool_or(def, "is_constant", false)?;
            let f = *by_name.entry(name.clone()).or_insert_with(|| {
                frames.push(FrameInfo {
                    name,
                    parent: usize::MAX,
                    parallel_iterations: parallel as usize,
                    enters: 0,
                    pending: Vec::new(),
                    slots: 0,
                });
                frames.len() - 1
            });
            frames[f].enters += 1;
            enter[i] = Some((f, constant));
        }

        // Frames by reachability from the roots.
        let mut frame_of = vec![usize::MAX; n];
        let mut stack: Vec<usize> = roots.to_vec();
        for &r in roots {
            frame_of[r] = ROOT;
        }
        while let Some(src) = stack.pop() {
            let here = frame_of[src];
            let there = match plan_nodes[src].kind {
                Kind::Enter => {
                    let (child, _) = enter[src].expect("Enter nodes have a frame");
                    let parent = &mut frames[child].parent;
                    if *parent == usize::MAX {
                        *parent = here;
                    } else if *parent != here {
                        return Err(Status::invalid_argument(format!(
                            "while loop frame `{}` is entered from two frames (`{}` is in \
                             another frame than the loop's other Enter nodes)",
                            frames[child].name, plan_nodes[src].def.name
                        )));
                    }
                    child
                }
                Kind::Exit => {
                    if here == ROOT {
                        return Err(Status::invalid_argument(format!(
                            "node `{}` ({}) is an Exit outside any while loop; an Exit must \
                             follow its loop's Switch",
                            plan_nodes[src].def.name, plan_nodes[src].def.op
                        )));
                    }
                    frames[here].parent
                }
                _ => here,
            };
            let successors = data_out[src]
                .iter()
                .map(|e| e.dst)
                .chain(control_out[src].iter().copied());
            for dst in successors {
                if frame_of[dst] == usize::MAX {
                    frame_of[dst] = there;
                    stack.push(dst);
                } else if frame_of[dst] != there {
                    let name = |f: usize| {
                        if f == ROOT {
                            "the root frame".to_string()
                        } else {
                            format!("while loop `{}`", frames[f].name)
                        }
                    };
                    return Err(Status::invalid_argument(format!(
                        "node `{}` ({}) has inputs from {} and from {}; a value enters a while \
                         loop only through an Enter and leaves it only through an Exit",
                        plan_nodes[dst].def.name,
                        plan_nodes[dst].def.op,
                        name(frame_of[dst]),
                        name(there)
                    )));
                }
            }
        }
        if let Some(stray) = frame_of.iter().position(|&f| f == usize::MAX) {
            return Err(Status::invalid_argument(format!(
                "node `{}` ({}) cannot be reached from any node without inputs: it is on a \
                 cycle that no Merge of a while loop breaks",
                plan_nodes[stray].def.name, plan_nodes[stray].def.op
            )));
        }

        let mut local = vec![0; n];
        let mut input_base = vec![0; n];
        for (i, node) in plan_nodes.iter().enumerate() {
            let frame = &mut frames[frame_of[i]];
            local[i] = frame.pending.len();
            input_base[i] = frame.slots;
            frame.slots += node.inputs.len();
            let produced = node
                .inputs
                .iter()
                .filter(|s| matches!(s, Source::Output { .. }))
                .count() as u32;
            let controls = control_inputs[i].len() as u32;
            frame.pending.push(if node.kind == Kind::Merge {
                1 + 2 * controls
            } else {
                produced + controls
            });
        }
        Ok(ControlPlan {
            frames,
            frame_of,
            local,
            input_base,
            data_out,
            control_out,
            data_inputs,
            enter,
        })
    }

    pub(super) fn frame_name(&self, f: usize) -> &str {
        &self.frames[f].name
    }

    /// INVALID_ARGUMENT naming the fetch when `node`'s outputs are inside a while loop (only
    /// values of the root frame can be fetched: they have one value per step).
    pub(super) fn check_fetch(&self, name: &str, node: usize, kind: Kind) -> Result<()> {
        let frame = match kind {
            Kind::Exit => self.frames[self.frame_of[node]].parent,
            _ => self.frame_of[node],
        };
        if frame == ROOT {
            return Ok(());
        }
        Err(Status::invalid_argument(format!(
            "fetch `{name}` is inside while loop `{}`, where it has a value per iteration; fetch \
             a value the loop passes out through its Exit",
            self.frames[frame].name
        )))
    }
}

/// The id of a frame instance in rendezvous keys, computed as TensorFlow's executor computes it
/// (`Hash64Combine(parent, Hash64Combine(iteration, Hash64(frame name)))`), so that the two
/// ends of a transfer inside a loop agree on its key whether each end runs on tessera or on
/// TensorFlow.
pub(super) fn frame_id(parent: u64, iter: i64, name: &str) -> u64 {
    hash64_combine(parent, hash64_combine(iter as u64, hash64(name.as_bytes())))
}

fn hash64_combine(a: u64, b: u64) -> u64 {
    a ^ (b
        .wrapping_add(0x9e37_79b9_7f4a_7800)
        .wrapping_add(a << 10)
        .wrapping_add(a >> 4))
}

/// TensorFlow's 64-bit string hash (a MurmurHash2 variant, seed `0xDECAFCAFFE`).
fn hash64(data: &[u8]) -> u64 {
    const M: u64 = 0xc6a4_a793_5bd1_e995;
    const R: u32 = 47;
    let mut h: u64 = 0x00de_cafc_affe ^ (data.len() as u64).wrapping_mul(M);
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let mut k = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h ^= k;
        h = h.wrapping_mul(M);
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u64::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M);
    h ^= h >> R;
    h
}
