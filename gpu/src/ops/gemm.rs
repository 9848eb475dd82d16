//! The real-width engine's projections: bf16 GEMMs on cuBLASLt with f32 accumulation
//! and f32 output (optionally added to an f32 residual in place), or bf16 output where
//! the product feeds a bf16 kernel (the prefill's key and value up-projection).
//!
//! cuBLAS picks its kernel and split-K by the row count M, so by default a row's bits
//! change with the size of its batch (measured through torch on an H100: at o_proj from
//! M 16, at kv_a from M 64, at q_a from M 128). [`GemmAlgo::Invariant`] pins one
//! algorithm per weight shape, chosen once by the heuristic at [`REFERENCE_ROWS`] rows
//! with split-K forced off, and runs it at every M: each output element is then reduced
//! by the same kernel over the same K order whatever the batch, so a request's bits do
//! not depend on its neighbours. `gpu-test` proves it across M for every projection
//! shape of the model; [`GemmAlgo::Heuristic`] is what an engine gets by default, kept
//! to measure what the pinning costs.
//!
//! Shapes are row-major as the backend sees them: `y[m, n] (+)= x[m, k] W[k, n]` with
//! the weight stored transposed, `W^T [n, k]` (nn.Linear's layout). In cuBLAS's
//! column-major terms that is `D (n x m) = op(A) (n x k) B (k x m)`, which [`GemmShape`]
//! states directly so that per-head batched products (the absorbed query and the value
//! up-projection) fit the same call.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::sys as lt;

use crate::device::{GpuDevice, GpuError};
use crate::launch::{Buf, DPtr};

/// The row count at which [`GemmAlgo::Invariant`] asks the heuristic for its algorithm:
/// a verify step of 64 rows of 1 + 3 tokens.
pub const REFERENCE_ROWS: usize = 256;

/// cuBLASLt's workspace (what the heuristic may use; the pinned algorithms need none
/// with split-K off, but may take some).
const WORKSPACE_BYTES: usize = 32 << 20;

/// How each GEMM's algorithm is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GemmAlgo {
    /// One algorithm per shape whatever M, split-K off: batch-invariant.
    Invariant,
    /// The heuristic's choice for each M (cuBLAS's default behaviour): fastest, but a
    /// row's bits depend on M.
    Heuristic,
}

impl GemmAlgo {
    /// The name reports and fingerprints use.
    pub fn name(self) -> &'static str {
        match self {
            GemmAlgo::Invariant => "invariant",
            GemmAlgo::Heuristic => "heuristic",
        }
    }
}

/// One (batched) product in cuBLAS's column-major terms, `D[b] = op(A[b]) B[b] (+ C[b])`:
/// `op(A)` is `n x k` (A stored `k x n` with `trans_a`, else `n x k`), B is `k x m`, D
/// and C are `n x m`; `ld*` are leading dimensions and `stride_*` the elements between
/// batches, all in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub lda: usize,
    pub ldb: usize,
    pub ldd: usize,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_d: usize,
}

impl GemmShape {
    /// `y[m, n] = x[m, k] W[k, n]`, `W` stored transposed (`[n, k]`), `x` rows `sx` apart,
    /// `y` dense.
    pub fn linear(m: usize, k: usize, n: usize, sx: usize) -> Self {
        Self {
            m,
            n,
            k,
            trans_a: true,
            lda: k,
            ldb: sx,
            ldd: n,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_d: 0,
        }
    }

    /// Elements of A, B and D the call touches: the host-side bounds of its pointers.
    fn extents(&self) -> (usize, usize, usize) {
        let last = self.batch - 1;
        let (a_rows, a_cols) = if self.trans_a {
            (self.k, self.n)
        } else {
            (self.n, self.k)
        };
        let span = |ld: usize, rows: usize, cols: usize, stride: usize| {
            last * stride + (cols - 1) * ld + rows
        };
        (
            span(self.lda, a_rows, a_cols, self.stride_a),
            span(self.ldb, self.k, self.m, self.stride_b),
            span(self.ldd, self.n, self.m, self.stride_d),
        )
    }

    /// The shape with M replaced: what an invariant algorithm is keyed by is the rest.
    fn with_rows(self, m: usize) -> Self {
        Self { m, ..self }
    }
}

/// The element type a product writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GemmOut {
    F32,
    /// Rounded to nearest even from the f32 accumulator by cuBLASLt's epilogue.
    Bf16,
}

impl GemmOut {
    fn data_type(self) -> lt::cudaDataType {
        match self {
            GemmOut::F32 => F32,
            GemmOut::Bf16 => BF16,
        }
    }
}

/// A plan's key: the shape and the output type.
type PlanKey = (GemmShape, GemmOut);

/// The descriptors of one shape at one M, and the algorithm it runs.
struct Plan {
    desc: lt::cublasLtMatmulDesc_t,
    a: lt::cublasLtMatrixLayout_t,
    b: lt::cublasLtMatrixLayout_t,
    d: lt::cublasLtMatrixLayout_t,
    algo: lt::cublasLtMatmulAlgo_t,
    workspace_bytes: usize,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each was created once by Plan::new and is destroyed once here; a
        // failure to destroy leaks a descriptor, nothing more.
        unsafe {
            lt::cublasLtMatmulDescDestroy(self.desc);
            lt::cublasLtMatrixLayoutDestroy(self.a);
            lt::cublasLtMatrixLayoutDestroy(self.b);
            lt::cublasLtMatrixLayoutDestroy(self.d);
        }
    }
}

/// The plans made so far: per (shape, M), and the pinned algorithm per shape without M.
#[derive(Default)]
struct Plans {
    by_shape: BTreeMap<PlanKey, Plan>,
    pinned: BTreeMap<PlanKey, lt::cublasLtMatmulAlgo_t>,
}

/// A cuBLASLt handle, its workspace and the plans made on it.
pub struct Gemm {
    handle: lt::cublasLtHandle_t,
    workspace: Buf<u8>,
    pub algo: GemmAlgo,
    plans: Mutex<Plans>,
}

// SAFETY: the handle and descriptors are used from one thread at a time (the plan cache
// sits behind a mutex, and the backend runs one step at a time on one stream); cuBLASLt
// handles may move between threads.
unsafe impl Send for Gemm {}
// SAFETY: as above; every use of the raw handles goes through &self methods that lock
// the plan cache for the whole call.
unsafe impl Sync for Gemm {}

fn check(status: lt::cublasStatus_t, what: impl FnOnce() -> String) -> Result<(), GpuError> {
    match status {
        lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS => Ok(()),
        s => Err(GpuError::Blas {
            what: what(),
            status: format!("{s:?}"),
        }),
    }
}

const BF16: lt::cudaDataType = lt::cudaDataType::CUDA_R_16BF;
const F32: lt::cudaDataType = lt::cudaDataType::CUDA_R_32F;

/// A column-major layout of `rows x cols`, leading dimension `ld`, `batch` of them
/// `stride` apart.
fn layout(
    ty: lt::cudaDataType,
    (rows, cols, ld): (usize, usize, usize),
    (batch, stride): (usize, usize),
) -> Result<lt::cublasLtMatrixLayout_t, GpuError> {
    let mut l = std::ptr::null_mut();
    // SAFETY: cublasLtMatrixLayoutCreate writes the new descriptor into l.
    let s =
        unsafe { lt::cublasLtMatrixLayoutCreate(&mut l, ty, rows as u64, cols as u64, ld as i64) };
    check(s, || format!("creating a {rows}x{cols} layout"))?;
    if batch > 1 {
        let (count, stride) = (batch as i32, stride as i64);
        // SAFETY: l is a live layout; each attribute gets a value of its documented type.
        unsafe {
            let s = lt::cublasLtMatrixLayoutSetAttribute(
                l,
                lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                (&count as *const i32).cast(),
                4,
            );
            check(s, || "setting a batch count".into())?;
            let s = lt::cublasLtMatrixLayoutSetAttribute(
                l,
                lt::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                (&stride as *const i64).cast(),
                8,
            );
            check(s, || "setting a batch stride".into())?;
        }
    }
    Ok(l)
}

impl Plan {
    /// The descriptors of `s` writing `out` (algorithm still to be chosen).
    fn new(s: &GemmShape, out: GemmOut) -> Result<Self, GpuError> {
        let mut desc = std::ptr::null_mut();
        // SAFETY: creates a descriptor into desc.
        let st = unsafe {
            lt::cublasLtMatmulDescCreate(
                &mut desc,
                lt::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                F32,
            )
        };
        check(st, || "creating a matmul descriptor".into())?;
        let op = if s.trans_a {
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N
        };
        // SAFETY: desc is live; TRANSA takes a cublasOperation_t (an i32-sized enum).
        let st = unsafe {
            lt::cublasLtMatmulDescSetAttribute(
                desc,
                lt::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&op as *const cudarc::cublas::sys::cublasOperation_t).cast(),
                std::mem::size_of::<cudarc::cublas::sys::cublasOperation_t>(),
            )
        };
        check(st, || "setting TRANSA".into())?;
        let a_dims = if s.trans_a {
            (s.k, s.n, s.lda)
        } else {
            (s.n, s.k, s.lda)
        };
        let batch = |stride| (s.batch, stride);
        let mut plan = Self {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: lt::cublasLtMatmulAlgo_t { data: [0; 8] },
            workspace_bytes: 0,
        };
        plan.a = layout(BF16, a_dims, batch(s.stride_a))?;
        plan.b = layout(BF16, (s.k, s.m, s.ldb), batch(s.stride_b))?;
        plan.d = layout(out.data_type(), (s.n, s.m, s.ldd), batch(s.stride_d))?;
        Ok(plan)
    }

    /// The heuristic's first algorithm for this plan's shape.
    fn heuristic(
        &self,
        handle: lt::cublasLtHandle_t,
    ) -> Result<lt::cublasLtMatmulAlgo_t, GpuError> {
        let mut pref = std::ptr::null_mut();
        // SAFETY: creates a preference into pref, sets its workspace cap (a u64), asks
        // for one result into a properly sized struct, and destroys the preference.
        unsafe {
            check(lt::cublasLtMatmulPreferenceCreate(&mut pref), || {
                "creating a matmul preference".into()
            })?;
            let cap = WORKSPACE_BYTES as u64;
            let st = lt::cublasLtMatmulPreferenceSetAttribute(
                pref,
                lt::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&cap as *const u64).cast(),
                8,
            );
            let mut result: lt::cublasLtMatmulHeuristicResult_t = std::mem::zeroed();
            let mut found = 0;
            let st2 = if st == lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                lt::cublasLtMatmulAlgoGetHeuristic(
                    handle,
                    self.desc,
                    self.a,
                    self.b,
                    self.d,
                    self.d,
                    pref,
                    1,
                    &mut result,
                    &mut found,
                )
            } else {
                st
            };
            lt::cublasLtMatmulPreferenceDestroy(pref);
            check(st2, || {
                "asking cuBLASLt's heuristic for an algorithm".into()
            })?;
            if found == 0 {
                return Err(GpuError::Blas {
                    what: "asking cuBLASLt's heuristic for an algorithm".into(),
                    status: "no algorithm for the shape".into(),
                });
            }
            Ok(result.algo)
        }
    }

    /// Takes `algo` for this plan, once cuBLASLt confirms it runs this shape; records the
    /// workspace it needs.
    fn adopt(
        &mut self,
        handle: lt::cublasLtHandle_t,
        algo: lt::cublasLtMatmulAlgo_t,
        s: &GemmShape,
    ) -> Result<(), GpuError> {
        // SAFETY: a plain C struct of integers and floats, for which all zeros is valid.
        let mut result: lt::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: every descriptor is live (made by Plan::new); cuBLASLt writes only into
        // `result`.
        let st = unsafe {
            lt::cublasLtMatmulAlgoCheck(
                handle,
                self.desc,
                self.a,
                self.b,
                self.d,
                self.d,
                &algo,
                &mut result,
            )
        };
        check(st, || format!("checking the pinned algorithm on {s:?}"))?;
        if result.workspaceSize > WORKSPACE_BYTES {
            return Err(GpuError::Blas {
                what: format!("the algorithm for {s:?}"),
                status: format!("needs {} bytes of workspace", result.workspaceSize),
            });
        }
        self.algo = algo;
        self.workspace_bytes = result.workspaceSize;
        Ok(())
    }
}

/// Turns split-K off in `algo`: one CTA reduces each output element over all of K.
fn without_split_k(
    mut algo: lt::cublasLtMatmulAlgo_t,
) -> Result<lt::cublasLtMatmulAlgo_t, GpuError> {
    let one: i32 = 1;
    let none = lt::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
    // SAFETY: algo is an initialized algorithm struct; SPLITK_NUM takes an i32 and
    // REDUCTION_SCHEME a u32.
    unsafe {
        let st = lt::cublasLtMatmulAlgoConfigSetAttribute(
            &mut algo,
            lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
            (&one as *const i32).cast(),
            4,
        );
        check(st, || "turning split-K off".into())?;
        let st = lt::cublasLtMatmulAlgoConfigSetAttribute(
            &mut algo,
            lt::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
            (&none as *const u32).cast(),
            4,
        );
        check(st, || "turning the split-K reduction off".into())?;
    }
    Ok(algo)
}

impl Gemm {
    /// A cuBLASLt handle on `dev`'s stream with its workspace. Fails as an environment
    /// error when libcublasLt cannot be loaded.
    pub fn new(dev: &GpuDevice, algo: GemmAlgo) -> Result<Self, GpuError> {
        // SAFETY: only probes whether the shared library loads.
        if !unsafe { lt::is_culib_present() } {
            return Err(GpuError::NoBlas(
                "libcublasLt (CUDA 13) could not be loaded".into(),
            ));
        }
        let mut handle = std::ptr::null_mut();
        // SAFETY: creates a handle into `handle`.
        let st = unsafe { lt::cublasLtCreate(&mut handle) };
        check(st, || "creating a cuBLASLt handle".into())?;
        Ok(Self {
            handle,
            workspace: Buf::uninit(dev, WORKSPACE_BYTES, "cuBLASLt workspace")?,
            algo,
            plans: Mutex::new(Plans::default()),
        })
    }

    /// The plan of `s`, made on first use. Invariant: the algorithm pinned for the shape
    /// without M (chosen at [`REFERENCE_ROWS`], split-K off); heuristic: chosen at `s.m`.
    fn plan<'p>(&self, plans: &'p mut Plans, (s, out): PlanKey) -> Result<&'p Plan, GpuError> {
        let s = &s;
        if !plans.by_shape.contains_key(&(*s, out)) {
            let algo = match self.algo {
                GemmAlgo::Heuristic => Plan::new(s, out)?.heuristic(self.handle)?,
                GemmAlgo::Invariant => {
                    let key = (s.with_rows(0), out);
                    match plans.pinned.get(&key) {
                        Some(a) => *a,
                        None => {
                            let reference = Plan::new(&s.with_rows(REFERENCE_ROWS), out)?;
                            let a = without_split_k(reference.heuristic(self.handle)?)?;
                            plans.pinned.insert(key, a);
                            a
                        }
                    }
                }
            };
            let mut plan = Plan::new(s, out)?;
            plan.adopt(self.handle, algo, s)?;
            plans.by_shape.insert((*s, out), plan);
        }
        Ok(&plans.by_shape[&(*s, out)])
    }

    /// `d = op(a) b (+ c)` on `dev`'s stream; `c`, where given, must be `d` itself (the
    /// residual added in place).
    pub fn run(
        &self,
        dev: &GpuDevice,
        s: GemmShape,
        a: DPtr<u16>,
        b: DPtr<u16>,
        d: DPtr<f32>,
        accumulate: bool,
    ) -> Result<(), GpuError> {
        if s.m == 0 {
            return Ok(());
        }
        d.need(s.extents().2);
        let beta = if accumulate { 1.0f32 } else { 0.0 };
        self.launch(dev, (s, GemmOut::F32), a, b, d.addr(), beta)
    }

    /// `d = op(a) b` rounded to bf16 on `dev`'s stream.
    pub fn run_bf16_out(
        &self,
        dev: &GpuDevice,
        s: GemmShape,
        a: DPtr<u16>,
        b: DPtr<u16>,
        d: DPtr<u16>,
    ) -> Result<(), GpuError> {
        if s.m == 0 {
            return Ok(());
        }
        d.need(s.extents().2);
        self.launch(dev, (s, GemmOut::Bf16), a, b, d.addr(), 0.0)
    }

    /// One cuBLASLt call of `key` into `d` (whose extent the caller checked), with C = D.
    fn launch(
        &self,
        dev: &GpuDevice,
        key: PlanKey,
        a: DPtr<u16>,
        b: DPtr<u16>,
        d: u64,
        beta: f32,
    ) -> Result<(), GpuError> {
        let s = key.0;
        let (na, nb, _) = s.extents();
        a.need(na);
        b.need(nb);
        let mut plans = self
            .plans
            .lock()
            .expect("no GEMM panics while holding the plans");
        let p = self.plan(&mut plans, key)?;
        let alpha = 1.0f32;
        let stream = dev.stream.cu_stream() as lt::cudaStream_t;
        let dp = d as *mut c_void;
        // SAFETY: the descriptors describe the extents checked on a, b and d; C is
        // D (same layout), read before written by the same element's epilogue; alpha and
        // beta are host f32 (the default pointer mode); the workspace holds at least what
        // the algorithm needs (checked by adopt).
        let st = unsafe {
            lt::cublasLtMatmul(
                self.handle,
                p.desc,
                (&alpha as *const f32).cast(),
                a.addr() as *const c_void,
                p.a,
                b.addr() as *const c_void,
                p.b,
                (&beta as *const f32).cast(),
                dp,
                p.d,
                dp,
                p.d,
                &p.algo,
                self.workspace.ptr().addr() as *mut c_void,
                p.workspace_bytes,
                stream,
            )
        };
        check(st, || format!("running a GEMM of {s:?}"))
    }
}

impl Drop for Gemm {
    fn drop(&mut self) {
        self.plans.lock().map(|mut p| *p = Plans::default()).ok();
        // SAFETY: the handle was created by Gemm::new and every plan made on it is gone.
        unsafe { lt::cublasLtDestroy(self.handle) };
    }
}
