//! Device buffers addressed by raw pointers with host-side bounds, and the one launch
//! helper every kernel wrapper goes through. Kernels take offsets into larger buffers
//! (a row's tokens, a layer's cache); carrying `(addr, len)` pairs keeps those offsets
//! checked on the host, which the kernels themselves cannot do.

use std::marker::PhantomData;

use cudarc::driver::{
    sys, CudaFunction, CudaSlice, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};

use crate::device::{GpuDevice, GpuError};

/// A device address and how many `T` lie behind it.
#[derive(Debug)]
pub struct DPtr<T> {
    addr: u64,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> Clone for DPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DPtr<T> {}

impl<T> DPtr<T> {
    /// Elements behind the address.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address `n` elements in; panics past the end (a host-side sizing bug).
    pub fn offset(self, n: usize) -> Self {
        assert!(
            n <= self.len,
            "device offset {n} past a buffer of {}",
            self.len
        );
        Self {
            addr: self.addr + (n * std::mem::size_of::<T>()) as u64,
            len: self.len - n,
            _t: PhantomData,
        }
    }
    /// Elements `[from, from + n)`.
    pub fn range(self, from: usize, n: usize) -> Self {
        let p = self.offset(from);
        assert!(n <= p.len, "device range of {n} past a buffer of {}", p.len);
        Self { len: n, ..p }
    }
    /// Asserts at least `n` elements are addressable; returns self.
    pub fn need(self, n: usize) -> Self {
        assert!(
            n <= self.len,
            "kernel needs {n} elements, buffer has {}",
            self.len
        );
        self
    }
    /// The same memory as elements of `U`, which must have `T`'s size (bf16 values as
    /// the `u16` bits the kernels take, say).
    pub fn cast<U>(self) -> DPtr<U> {
        assert_eq!(
            std::mem::size_of::<T>(),
            std::mem::size_of::<U>(),
            "a cast must keep the element size"
        );
        DPtr {
            addr: self.addr,
            len: self.len,
            _t: PhantomData,
        }
    }
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

/// An owned device buffer.
pub struct Buf<T> {
    slice: CudaSlice<T>,
    addr: u64,
}

impl<T: DeviceRepr> Buf<T> {
    /// `len` elements, unset (callers poison or overwrite them). `what` names the
    /// allocation in an out-of-memory error.
    pub fn uninit(dev: &GpuDevice, len: usize, what: &str) -> Result<Self, GpuError> {
        // SAFETY: the memory is written (poisoned, filled or copied into) before any
        // read; every reader goes through a kernel that the host sized for it.
        let bytes = len.max(1) * std::mem::size_of::<T>();
        let slice = unsafe { dev.stream.alloc::<T>(len.max(1)) }
            .map_err(|e| GpuError::alloc(what, bytes, e))?;
        dev.allocated_bytes
            .fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        let addr = slice.device_ptr(&dev.stream).0;
        Ok(Self { slice, addr })
    }

    /// A copy of `host` on the device.
    pub fn from_host(dev: &GpuDevice, host: &[T], what: &str) -> Result<Self, GpuError> {
        let mut b = Self::uninit(dev, host.len(), what)?;
        b.write(dev, host)?;
        Ok(b)
    }

    /// Copies `host` to the start of the buffer.
    pub fn write(&mut self, dev: &GpuDevice, host: &[T]) -> Result<(), GpuError> {
        if host.is_empty() {
            return Ok(());
        }
        assert!(
            host.len() <= self.slice.len(),
            "host copy larger than its buffer"
        );
        let mut view = self.slice.slice_mut(0..host.len());
        dev.stream
            .memcpy_htod(host, &mut view)
            .map_err(GpuError::driver("copying inputs to the device"))
    }

    /// The first `n` elements, copied back (waits for the stream).
    pub fn read(&self, dev: &GpuDevice, n: usize) -> Result<Vec<T>, GpuError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        dev.stream
            .clone_dtoh(&self.slice.slice(0..n))
            .map_err(GpuError::driver("copying results back"))
    }

    /// Elements `[from, from + n)`, copied back (waits for the stream).
    pub fn read_at(&self, dev: &GpuDevice, from: usize, n: usize) -> Result<Vec<T>, GpuError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        dev.stream
            .clone_dtoh(&self.slice.slice(from..from + n))
            .map_err(GpuError::driver("copying results back"))
    }

    /// The cudarc slice, for a library call (cuBLAS) that takes one.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }
    /// The cudarc slice, mutable.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    pub fn ptr(&self) -> DPtr<T> {
        DPtr {
            addr: self.addr,
            len: self.slice.len(),
            _t: PhantomData,
        }
    }

    pub fn len(&self) -> usize {
        self.slice.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

/// One kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
    F64(f64),
    /// Passed by value to a `const __grid_constant__` parameter.
    Map(TensorMap),
}

/// The copy engine's (TMA's) view of a row-major 2-D bf16 array: a `CUtensorMap`, handed
/// to a kernel by value.
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub struct TensorMap(sys::CUtensorMap);

// SAFETY: a plain 128-byte value with no pointers into host memory; the kernel reads it
// as its own 128-byte `__grid_constant__` struct.
unsafe impl DeviceRepr for TensorMap {}

impl TensorMap {
    /// `rows` rows of `cols` bf16 at `base` (bounds checked on the host), read in boxes of
    /// `box_cols` x `box_rows` into shared memory with the 128-byte swizzle; rows past
    /// the end read as zero.
    pub fn bf16_rows(
        base: DPtr<u16>,
        cols: usize,
        rows: usize,
        boxes: (usize, usize),
    ) -> Result<Self, GpuError> {
        Self::bf16_strided(base, cols, rows, cols, boxes)
    }

    /// As [`Self::bf16_rows`], rows `row_stride` elements apart (a multiple of 8: the copy
    /// engine steps in 16 bytes) and `cols <= row_stride`: a strided view, such as one
    /// head's columns of a `[rows, heads, width]` array.
    pub fn bf16_strided(
        base: DPtr<u16>,
        cols: usize,
        rows: usize,
        row_stride: usize,
        (box_cols, box_rows): (usize, usize),
    ) -> Result<Self, GpuError> {
        assert!(
            cols <= row_stride && row_stride.is_multiple_of(8),
            "row stride {row_stride}"
        );
        assert!(
            base.addr.is_multiple_of(16),
            "tensor map base {:#x} not 16-byte aligned",
            base.addr
        );
        if rows > 0 {
            base.need((rows - 1) * row_stride + cols);
        }
        let dims = [cols as u64, rows as u64];
        let strides = [(row_stride * 2) as u64];
        let boxes = [box_cols as u32, box_rows as u32];
        let unit = [1u32, 1];
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // L2 promotion to 128 bytes, CUTLASS's default for its TMA maps (cute's
        // copy_traits_sm90_tma.hpp), which FlashMLA's decode (9241ae3) takes. A box row of
        // the decode's cache maps is 128 bytes of a 1152-byte row; promoted to 256 bytes,
        // the memory-bound decode ran slower (why was not traced). On the H200 (run 265,
        // `gpu-bench`, 2 rounds in one call), against 256 bytes: 16 heads q 1 and 4 B 128
        // L 8k 0.959-0.963x (fast), 0.963-0.984x (the invariant launches); 128 heads
        // 0.986-1.011x; no promotion at all gave the seesaw decode the same within 1.2%.
        // The prefill launches at 128 heads moved 0.974-1.009x (run 266; the TMA prefill
        // 0.974-1.004x).
        // SAFETY: every pointer is to a live local of the length the call reads (rank 2:
        // two dims, one stride, two box sizes, two element strides); the global address
        // is device memory checked above.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                2,
                base.addr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                unit.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        }
        .result()
        .map_err(GpuError::driver(format!(
            "encoding a tensor map of {rows} x {cols} bf16, box {box_cols} x {box_rows}"
        )))?;
        Ok(Self(map))
    }
}

impl<T> From<DPtr<T>> for Arg {
    fn from(p: DPtr<T>) -> Self {
        Arg::Ptr(p.addr)
    }
}
impl From<usize> for Arg {
    fn from(v: usize) -> Self {
        Arg::I32(i32::try_from(v).expect("kernel size argument fits in i32"))
    }
}
impl From<f32> for Arg {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}
impl From<f64> for Arg {
    fn from(v: f64) -> Self {
        Arg::F64(v)
    }
}
impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Arg::I32(v as i32)
    }
}

/// Threads per block of every specmla kernel (THREADS in common.cuh).
pub const THREADS: u32 = 128;

/// Launches `f` over `grid` blocks of [`THREADS`] threads with `args` in order.
///
/// # Safety
/// `args` must match the kernel's parameter list in order and type, and every pointer
/// must address as many elements as the kernel reads or writes through it for this grid.
pub unsafe fn launch(
    dev: &GpuDevice,
    f: &CudaFunction,
    name: &str,
    grid: (usize, usize),
    args: &[Arg],
) -> Result<(), GpuError> {
    let cfg = LaunchConfig {
        grid_dim: (grid.0 as u32, grid.1 as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: forwarded to the caller's contract.
    unsafe { launch_cfg(dev, f, name, cfg, args) }
}

/// [`launch`] with an explicit grid, block and dynamic shared memory.
///
/// # Safety
/// As [`launch`]; the kernel must also accept `cfg`'s block size and shared memory.
pub unsafe fn launch_cfg(
    dev: &GpuDevice,
    f: &CudaFunction,
    name: &str,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<(), GpuError> {
    let (x, y, z) = cfg.grid_dim;
    if x == 0 || y == 0 || z == 0 {
        return Ok(());
    }
    let mut b = dev.stream.launch_builder(f);
    for a in args {
        match a {
            Arg::Ptr(p) => b.arg(p),
            Arg::I32(v) => b.arg(v),
            Arg::I64(v) => b.arg(v),
            Arg::F32(v) => b.arg(v),
            Arg::F64(v) => b.arg(v),
            Arg::Map(m) => b.arg(m),
        };
    }
    // SAFETY: forwarded to the caller's contract.
    unsafe { b.launch(cfg) }.map_err(GpuError::driver(format!("launching {name}")))?;
    Ok(())
}

/// The launch attribute that groups a grid's CTAs in clusters of `cluster_y` along y.
fn cluster_attr(cluster_y: u32) -> sys::CUlaunchAttribute {
    // SAFETY: a plain C union; the cluster-dimension member is the one the id names.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
        x: 1,
        y: cluster_y,
        z: 1,
    };
    attr
}

/// A `cuLaunchKernelEx`-style configuration of `grid` x `block` on the device's stream with
/// the one attribute `attr` (which must outlive its use).
fn launch_config_ex(
    dev: &GpuDevice,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    smem_bytes: u32,
    attr: &mut sys::CUlaunchAttribute,
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block.0,
        blockDimY: block.1,
        blockDimZ: block.2,
        sharedMemBytes: smem_bytes,
        hStream: dev.stream.cu_stream(),
        attrs: attr,
        numAttrs: 1,
    }
}

/// [`launch_cfg`] with the grid's CTAs in clusters of `cluster_y` along y (resident
/// together, sharing distributed shared memory). cudarc has no safe cluster launch, so this
/// calls `cuLaunchKernelEx` with the cluster-dimension attribute.
///
/// # Safety
/// As [`launch_cfg`]; `cluster_y` must divide the grid's y and the kernel must expect
/// clusters of that shape.
pub unsafe fn launch_cluster(
    dev: &GpuDevice,
    f: &CudaFunction,
    name: &str,
    cfg: LaunchConfig,
    cluster_y: u32,
    args: &[Arg],
) -> Result<(), GpuError> {
    let (x, y, z) = cfg.grid_dim;
    if x == 0 || y == 0 || z == 0 {
        return Ok(());
    }
    assert!(
        y % cluster_y == 0,
        "clusters of {cluster_y} do not tile a grid {y} high"
    );
    dev.ctx
        .bind_to_thread()
        .map_err(GpuError::driver("binding the context"))?;
    // The driver reads each parameter through a pointer to its value.
    let mut params: Vec<*mut std::ffi::c_void> = args
        .iter()
        .map(|a| match a {
            Arg::Ptr(v) => v as *const u64 as *mut std::ffi::c_void,
            Arg::I32(v) => v as *const i32 as *mut std::ffi::c_void,
            Arg::I64(v) => v as *const i64 as *mut std::ffi::c_void,
            Arg::F32(v) => v as *const f32 as *mut std::ffi::c_void,
            Arg::F64(v) => v as *const f64 as *mut std::ffi::c_void,
            Arg::Map(m) => &m.0 as *const sys::CUtensorMap as *mut std::ffi::c_void,
        })
        .collect();
    let mut attr = cluster_attr(cluster_y);
    let config = launch_config_ex(
        dev,
        cfg.grid_dim,
        cfg.block_dim,
        cfg.shared_mem_bytes,
        &mut attr,
    );
    // SAFETY: `params` points at live values matching the kernel's parameters (the
    // caller's contract); `config` and `attr` outlive the call.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(GpuError::driver(format!("launching {name} in clusters")))
}

/// How many clusters of `cluster_y` CTAs of `f` (`block` threads, `smem_bytes` each) the
/// device holds at once, as the driver counts them: whole clusters must sit in one GPC, so
/// this can fall short of SMs / cluster_y.
pub fn max_active_clusters(
    dev: &GpuDevice,
    f: &CudaFunction,
    block: u32,
    smem_bytes: u32,
    cluster_y: u32,
) -> Result<usize, GpuError> {
    dev.ctx
        .bind_to_thread()
        .map_err(GpuError::driver("binding the context"))?;
    let mut attr = cluster_attr(cluster_y);
    let config = launch_config_ex(dev, (1, cluster_y, 1), (block, 1, 1), smem_bytes, &mut attr);
    let mut n: std::ffi::c_int = 0;
    // SAFETY: `n`, `config` and `attr` outlive the call; it only reads the function.
    unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, f.cu_function(), &config) }
        .result()
        .map_err(GpuError::driver("counting resident clusters"))?;
    Ok(n.max(0) as usize)
}

/// Copies `n` elements from `src` to `dst` on the stream (ordered with the kernels).
pub fn copy<T>(dev: &GpuDevice, src: DPtr<T>, dst: DPtr<T>, n: usize) -> Result<(), GpuError> {
    if n == 0 {
        return Ok(());
    }
    src.need(n);
    dst.need(n);
    dev.ctx
        .bind_to_thread()
        .map_err(GpuError::driver("binding the context"))?;
    // SAFETY: both ranges were checked to hold n elements of live device buffers.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(
            dst.addr,
            src.addr,
            n * std::mem::size_of::<T>(),
            dev.stream.cu_stream(),
        )
    }
    .map_err(GpuError::driver("copying on the device"))
}
