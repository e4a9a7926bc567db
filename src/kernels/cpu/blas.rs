//! OpenBLAS, loaded at run time where the host has it, for the large float products: its
//! kernels ran the bench models' large products about 20 % faster than the `gemm` crate's on the
//! development machine (BENCHES.md, GEMM). Nothing is linked at build time, so a build needs no
//! BLAS and a host without one multiplies with `gemm`.
//!
//! `TESSERA_BLAS` picks the library: unset, `libopenblas.so.0` (Debian's `libopenblas0`, any
//! of its variants); a path or file name, that library; `off`, none. The library's own threads
//! are set to one: tessera cuts a product into bands over the device's intra-op pool and calls
//! the library from those threads, as it calls `gemm`.

use std::ffi::c_int;
use std::sync::OnceLock;

/// The environment variable that picks the BLAS library.
const BLAS_VARIABLE: &str = "TESSERA_BLAS";

/// The library tried when `TESSERA_BLAS` is unset or empty.
const DEFAULT_LIBRARY: &str = "libopenblas.so.0";

/// CBLAS's enums (`cblas.h`).
const ROW_MAJOR: c_int = 101;
const NO_TRANSPOSE: c_int = 111;
const TRANSPOSE: c_int = 112;

/// `cblas_?gemm(order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)`.
type Gemm<T> = unsafe extern "C" fn(
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    T,
    *const T,
    c_int,
    *const T,
    c_int,
    T,
    *mut T,
    c_int,
);

/// A loaded BLAS: its `cblas_sgemm` and `cblas_dgemm`.
pub(crate) struct Blas {
    name: String,
    sgemm: Gemm<f32>,
    dgemm: Gemm<f64>,
    /// Keeps the functions' code mapped.
    _library: libloading::Library,
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas").field("name", &self.name).finish()
    }
}

/// The process's BLAS, loaded on first use as `TESSERA_BLAS` says; `None` when it is `off` or
/// the library cannot be loaded (said once in the log, with what to change).
pub(crate) fn get() -> Option<&'static Blas> {
    static BLAS: OnceLock<Option<Blas>> = OnceLock::new();
    BLAS.get_or_init(|| {
        let chosen = std::env::var(BLAS_VARIABLE)
            .ok()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        let library = match chosen.as_deref() {
            Some("off" | "none") => {
                tracing::info!("{BLAS_VARIABLE}=off: matrix products use the gemm crate");
                return None;
            }
            Some(path) => path.to_string(),
            None => DEFAULT_LIBRARY.to_string(),
        };
        match Blas::load(&library) {
            Ok(blas) => {
                tracing::info!("large matrix products use {library}");
                Some(blas)
            }
            Err(e) if chosen.is_some() => {
                tracing::warn!(
                    "{BLAS_VARIABLE}={library}: {e}; matrix products use the gemm crate (set \
                     {BLAS_VARIABLE} to an OpenBLAS library's path, or to off)"
                );
                None
            }
            Err(e) => {
                tracing::info!(
                    "no OpenBLAS ({e}): matrix products use the gemm crate (installing \
                     libopenblas0 speeds up large ones)"
                );
                None
            }
        }
    })
    .as_ref()
}

impl Blas {
    /// Loads `library` (a path, or a name the dynamic loader searches for) and sets its own
    /// threads to one where it has them (OpenBLAS's `openblas_set_num_threads`).
    pub(crate) fn load(library: &str) -> Result<Blas, String> {
        // SAFETY: loading runs the library's initialisers; a BLAS's set up its tables and,
        // for a threaded OpenBLAS, its threads, which the call below stops using.
        let loaded = unsafe { libloading::Library::new(library) }.map_err(|e| e.to_string())?;
        // SAFETY: the symbols have CBLAS's signatures (`cblas.h`), and OpenBLAS's
        // `openblas_set_num_threads(int)`.
        unsafe {
            let sgemm = *loaded
                .get::<Gemm<f32>>(b"cblas_sgemm\0")
                .map_err(|e| e.to_string())?;
            let dgemm = *loaded
                .get::<Gemm<f64>>(b"cblas_dgemm\0")
                .map_err(|e| e.to_string())?;
            if let Ok(set_threads) =
                loaded.get::<unsafe extern "C" fn(c_int)>(b"openblas_set_num_threads\0")
            {
                set_threads(1);
            }
            Ok(Blas {
                name: library.to_string(),
                sgemm,
                dgemm,
                _library: loaded,
            })
        }
    }
}

/// How CBLAS reads one operand: transposed or not (for the order of the output) and its
/// leading dimension.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Operand {
    transpose: bool,
    leading: c_int,
}

/// A `rows` x `cols` view with strides `rs`, `cs` (in elements) as CBLAS reads it in row-major
/// order: untransposed when its rows are contiguous, transposed when its columns are; `None`
/// when neither (or a stride is negative, or too large for an `int`). A dimension of one
/// element leaves its stride free.
fn row_major(rows: usize, cols: usize, rs: isize, cs: isize) -> Option<Operand> {
    let fits = |ld: isize, least: usize| {
        (ld >= least.max(1) as isize)
            .then(|| c_int::try_from(ld).ok())
            .flatten()
    };
    if cols <= 1 || cs == 1 {
        let ld = if rows <= 1 { cols.max(1) as isize } else { rs };
        if let Some(leading) = fits(ld, cols) {
            return Some(Operand {
                transpose: false,
                leading,
            });
        }
    }
    if rows <= 1 || rs == 1 {
        let ld = if cols <= 1 { rows.max(1) as isize } else { cs };
        if let Some(leading) = fits(ld, rows) {
            return Some(Operand {
                transpose: true,
                leading,
            });
        }
    }
    None
}

/// One product's call: `c (+)= a·b`, `a` m x k, `b` k x n, `c` m x n, each the address of its
/// first element with its row and column strides in elements.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: (usize, isize, isize),
    pub b: (usize, isize, isize),
    pub c: (usize, isize, isize),
    pub accumulate: bool,
}

/// A call as CBLAS takes it, in row-major order: a `rows` x `cols` output of `first · second`,
/// each operand its address and how it is read. A column-major output is written as its
/// transpose, `C^T = B^T A^T`: `first` is then B^T and `second` A^T.
pub(crate) struct Layout {
    rows: c_int,
    cols: c_int,
    first: (usize, Operand),
    second: (usize, Operand),
    ldc: c_int,
}

/// The layout of a call; `None` when a dimension is too large for an `int` or an operand has
/// no contiguous axis.
fn layout(call: &Call) -> Option<Layout> {
    let int = |d: usize| c_int::try_from(d).ok();
    let (m, n) = (int(call.m)?, int(call.n)?);
    int(call.k)?;
    let (a, a_rs, a_cs) = call.a;
    let (b, b_rs, b_cs) = call.b;
    let (_, c_rs, c_cs) = call.c;
    let c = row_major(call.m, call.n, c_rs, c_cs)?;
    Some(if c.transpose {
        Layout {
            rows: n,
            cols: m,
            first: (b, row_major(call.n, call.k, b_cs, b_rs)?),
            second: (a, row_major(call.k, call.m, a_cs, a_rs)?),
            ldc: c.leading,
        }
    } else {
        Layout {
            rows: m,
            cols: n,
            first: (a, row_major(call.m, call.k, a_rs, a_cs)?),
            second: (b, row_major(call.k, call.n, b_rs, b_cs)?),
            ldc: c.leading,
        }
    })
}

/// A float type CBLAS multiplies.
pub(crate) trait BlasFloat: Copy {
    /// # Safety
    /// As [`Blas::multiply`], with `layout` the call's.
    unsafe fn gemm(blas: &Blas, layout: &Layout, call: &Call);
}

fn flag(operand: Operand) -> c_int {
    if operand.transpose {
        TRANSPOSE
    } else {
        NO_TRANSPOSE
    }
}

macro_rules! blas_float {
    ($t:ty, $field:ident) => {
        impl BlasFloat for $t {
            unsafe fn gemm(blas: &Blas, layout: &Layout, call: &Call) {
                let ((first, a), (second, b)) = (layout.first, layout.second);
                (blas.$field)(
                    ROW_MAJOR,
                    flag(a),
                    flag(b),
                    layout.rows,
                    layout.cols,
                    call.k as c_int,
                    1.0,
                    first as *const $t,
                    a.leading,
                    second as *const $t,
                    b.leading,
                    if call.accumulate { 1.0 } else { 0.0 },
                    call.c.0 as *mut $t,
                    layout.ldc,
                )
            }
        }
    };
}

blas_float!(f32, sgemm);
blas_float!(f64, dgemm);

impl Blas {
    /// Runs `call` through the library; `false` (and nothing done) when its operands' layout
    /// is not one CBLAS takes, for the caller to multiply another way.
    ///
    /// # Safety
    /// The addresses and strides are those of live views whose shapes agree, and nothing else
    /// reads or writes `c`'s block meanwhile.
    pub(crate) unsafe fn multiply<T: BlasFloat>(&self, call: &Call) -> bool {
        match layout(call) {
            Some(layout) => {
                T::gemm(self, &layout, call);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_read_as_row_major_transposed_or_not_at_all() {
        let plain = |leading| Operand {
            transpose: false,
            leading,
        };
        let transposed = |leading| Operand {
            transpose: true,
            leading,
        };
        // Row-major, a row-major view into a wider array, a column-major view.
        assert_eq!(row_major(3, 4, 4, 1), Some(plain(4)));
        assert_eq!(row_major(3, 4, 10, 1), Some(plain(10)));
        assert_eq!(row_major(3, 4, 1, 3), Some(transposed(3)));
        // One row or one column: the free stride is not read.
        assert_eq!(row_major(1, 4, 0, 1), Some(plain(4)));
        assert_eq!(row_major(3, 1, 7, 99), Some(plain(7)));
        // Neither axis contiguous, a negative stride, rows overlapping.
        assert_eq!(row_major(3, 4, 8, 2), None);
        assert_eq!(row_major(3, 4, -4, 1), None);
        assert_eq!(row_major(3, 4, 2, 1), None);
    }

    #[test]
    fn a_call_multiplies_in_either_order_or_declines() {
        // The library itself is required under CI by the GEMM's tests; here it only skips.
        let Some(blas) = get() else {
            eprintln!("a_call_multiplies_in_either_order_or_declines: skipped, no OpenBLAS");
            return;
        };
        // [[1, 2, 3], [4, 5, 6]] · [[1, 0], [0, 1], [1, 1]], row-major.
        let a = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let b = [1.0f64, 0.0, 0.0, 1.0, 1.0, 1.0];
        let want = [4.0, 5.0, 10.0, 11.0];
        let call = |c: &mut [f64], c_rs, c_cs, accumulate| Call {
            m: 2,
            n: 2,
            k: 3,
            a: (a.as_ptr() as usize, 3, 1),
            b: (b.as_ptr() as usize, 2, 1),
            c: (c.as_mut_ptr() as usize, c_rs, c_cs),
            accumulate,
        };
        let mut c = [f64::NAN; 4];
        assert!(unsafe { blas.multiply::<f64>(&call(&mut c, 2, 1, false)) });
        assert_eq!(c, want);
        // A column-major output, accumulated.
        let mut c = [1.0; 4];
        assert!(unsafe { blas.multiply::<f64>(&call(&mut c, 1, 2, true)) });
        assert_eq!(c, [5.0, 11.0, 6.0, 12.0]);
        // An output with no contiguous axis is declined and left alone.
        let mut c = [0.0; 16];
        assert!(!unsafe { blas.multiply::<f64>(&call(&mut c, 8, 2, false)) });
        assert_eq!(c, [0.0; 16]);
    }
}
