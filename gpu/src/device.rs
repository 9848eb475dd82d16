//! Opening the device and compiling kernels: one clear error when there is no driver,
//! no device, or a compile failure (with the NVRTC log).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

/// Definitions every kernel file uses (NEG_INF, THREADS, block_sum).
pub const COMMON_SRC: &str = include_str!("../kernels/common.cuh");

/// Why the GPU cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    #[error("the NVIDIA driver supports CUDA {found}, specmla needs CUDA {needs} or newer (update the driver)")]
    DriverTooOld { found: String, needs: String },
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    #[error("NVRTC could not be loaded: {0}")]
    NoNvrtc(String),
    #[error("NVRTC failed to compile {name} for {arch}:\n{log}")]
    Compile {
        name: String,
        arch: String,
        log: String,
    },
    #[error("device out of memory allocating {what} ({bytes} bytes): {source}")]
    OutOfMemory {
        what: String,
        bytes: usize,
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A configuration whose allocations exceed the device's free memory, refused before
    /// any is made (the message names them).
    #[error("{0}")]
    DoesNotFit(String),
    #[error("libcublasLt could not be loaded: {0}")]
    NoBlas(String),
    /// A cuBLASLt call that failed (mid-run: a failed run, not the machine's fault).
    #[error("cuBLASLt failed {what}: {status}")]
    Blas { what: String, status: String },
    /// Weights generated on the device that differ from the host's copy (a failed run).
    #[error("{0}")]
    Mirror(String),
    #[error("CUDA call failed while {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
}

impl GpuError {
    /// Whether the error is the machine's (no driver, no device, a driver too old, no
    /// NVRTC, a kernel the device's compiler refuses, out of memory) rather than a CUDA
    /// call that failed mid-run (a launch, a copy), which is a failed run.
    pub fn is_environment(&self) -> bool {
        !matches!(
            self,
            GpuError::Driver { .. } | GpuError::Blas { .. } | GpuError::Mirror(_)
        )
    }

    /// Wraps a driver error with what was being done.
    pub fn driver(what: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
        let what = what.into();
        move |source| GpuError::Driver { what, source }
    }
}

impl GpuError {
    /// Wraps an allocation failure, naming the allocation.
    pub fn alloc(what: &str, bytes: usize, source: cudarc::driver::DriverError) -> GpuError {
        let what = what.to_string();
        if source.0 == cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
            GpuError::OutOfMemory {
                what,
                bytes,
                source,
            }
        } else {
            GpuError::Driver {
                what: format!("allocating {what} ({bytes} bytes)"),
                source,
            }
        }
    }
}

/// The CUDA version the bindings were built for (the `cuda-13000` feature).
pub const NEEDED_CUDA_VERSION: i32 = 13_000;

fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, v % 1000 / 10)
}

/// A driver older than the bindings would fail later on a missing symbol (a panic
/// inside cudarc); asking its version first turns that into one line.
fn check_driver_version() -> Result<(), GpuError> {
    let mut v = 0;
    // SAFETY: the library is present (checked by the caller); cuDriverGetVersion exists
    // in every driver and only writes the int it is given.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r != cudarc::driver::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(GpuError::NoDriver(format!(
            "cuDriverGetVersion failed: {r:?}"
        )));
    }
    if v < NEEDED_CUDA_VERSION {
        return Err(GpuError::DriverTooOld {
            found: cuda_version(v),
            needs: cuda_version(NEEDED_CUDA_VERSION),
        });
    }
    Ok(())
}

/// An open device: its context, a stream, and the NVRTC arch of the device.
pub struct GpuDevice {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// e.g. "sm_90a" on Hopper.
    pub arch: String,
    pub name: String,
    /// The device's multiprocessor count.
    pub sms: usize,
    /// The SM clock the device reports as its maximum (CU_DEVICE_ATTRIBUTE_CLOCK_RATE), MHz:
    /// what a measured clock is compared with.
    pub boost_clock_mhz: u32,
    /// Bytes every `Buf` allocated on this device so far (never decreased): what a
    /// check compares a computed footprint against.
    pub allocated_bytes: std::sync::atomic::AtomicU64,
}

impl GpuDevice {
    /// Opens device `ordinal`. Checks for the driver library first: cudarc's dynamic
    /// loader panics when it is missing, and a missing GPU must be one clear line.
    pub fn open(ordinal: usize) -> Result<Self, GpuError> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::NoDriver(
                "libcuda could not be loaded (no NVIDIA driver on this machine)".into(),
            ));
        }
        check_driver_version()?;
        // SAFETY: as above, for libnvrtc.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(GpuError::NoNvrtc(
                "libnvrtc (CUDA 13) could not be loaded".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::NoDevice(e.to_string()))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(GpuError::driver("reading the compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(GpuError::driver("reading the SM count"))? as usize;
        let boost_clock_mhz =
            ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)
                .map_err(GpuError::driver("reading the SM clock rate"))? as u32
                / 1000;
        // Hopper's arch-specific features (wgmma, TMA) need the "a" variant.
        let arch = if major == 9 {
            "sm_90a".to_string()
        } else {
            format!("sm_{major}{minor}")
        };
        // SAFETY: specmla uses one stream per device, so cudarc's cross-stream event
        // tracking has nothing to order; it must be off because recording events inside
        // a stream capture would break CUDA-graph capture.
        unsafe { ctx.disable_event_tracking() };
        // The legacy default stream cannot be captured into a graph.
        let stream = ctx
            .new_stream()
            .map_err(GpuError::driver("creating a stream"))?;
        Ok(Self {
            ctx,
            stream,
            arch,
            name,
            sms,
            boost_clock_mhz,
            allocated_bytes: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Refuses `allocs` when together they exceed the device's free memory: one line
    /// naming them, an environment error (exit 2).
    pub fn check_fits(&self, allocs: &[specmla_core::memory::Allocation]) -> Result<(), GpuError> {
        use specmla_core::memory::{describe, gib, total_bytes};
        let (free, _) = self
            .ctx
            .mem_get_info()
            .map_err(GpuError::driver("reading the free device memory"))?;
        let total = total_bytes(allocs);
        if total <= free as u64 {
            return Ok(());
        }
        Err(GpuError::DoesNotFit(format!(
            "the configuration needs {} of device memory ({}), but {} has {} free; lower \
             --num-layers or --num-gpu-blocks, or raise --tp",
            gib(total),
            describe(allocs),
            self.name,
            gib(free as u64)
        )))
    }

    /// Compiles CUDA C `src` (after the shared `common.cuh`) for this device and loads it.
    /// NVRTC's PTX goes to the driver, which assembles it. With
    /// `SPECMLA_PTXAS_OPTIONS` set (a tuning switch, possibly empty), NVRTC assembles the
    /// machine code itself with those `ptxas` options (comma-separated, as nvcc's
    /// `--ptxas-options` takes them) and the module loads from that. On the H200 (CUDA 13.0,
    /// driver 580, run 270) NVRTC's own assembly timed as the driver's (0.990-1.004x);
    /// `--register-usage-level=10`, FlashMLA's build setting, made the q 2 and q 4 launches
    /// at 128 heads, B 64, 1.036-1.045x slower (one process), and level 2 0.987-1.014x.
    /// The switch reaches every module the process compiles, the engine's too: it is for
    /// timing runs, as the README's list of environment variables says.
    pub fn compile(&self, name: &str, src: &str) -> Result<Arc<CudaModule>, GpuError> {
        let src = format!("{COMMON_SRC}\n{src}");
        let mut options = vec![
            format!("--gpu-architecture={}", self.arch),
            "--std=c++17".to_string(),
        ];
        let image = match std::env::var("SPECMLA_PTXAS_OPTIONS") {
            Ok(ptxas) => {
                options.extend(ptxas_flags(&ptxas));
                compile_cubin(&src, name, &options).map_err(|log| self.compile_error(name, log))?
            }
            Err(_) => {
                let opts = CompileOptions {
                    options,
                    name: Some(name.to_string()),
                    ..Default::default()
                };
                compile_ptx_with_opts(&src, opts).map_err(|e| match e {
                    CompileError::CompileError { log, .. } => {
                        self.compile_error(name, log.to_string_lossy().into_owned())
                    }
                    other => self.compile_error(name, format!("{other:?}")),
                })?
            }
        };
        self.ctx
            .load_module(image)
            .map_err(GpuError::driver(format!("loading module {name}")))
    }

    fn compile_error(&self, name: &str, log: String) -> GpuError {
        GpuError::Compile {
            name: name.into(),
            arch: self.arch.clone(),
            log,
        }
    }
}

/// NVRTC's options handing `ptxas` the comma-separated `list`: one `--ptxas-options`
/// each, as NVRTC reads one ptxas option per flag (`-v,-O3` in one is refused).
fn ptxas_flags(list: &str) -> Vec<String> {
    let each = list.split(',').map(str::trim).filter(|o| !o.is_empty());
    each.map(|o| format!("--ptxas-options={o}")).collect()
}

/// `src` compiled by NVRTC to machine code (`options` name a real architecture, `sm_*`):
/// the CUBIN, or NVRTC's log.
fn compile_cubin(src: &str, name: &str, options: &[String]) -> Result<Ptx, String> {
    use cudarc::nvrtc::{result, sys};
    let (src_c, name_c) = (
        std::ffi::CString::new(src).map_err(|e| e.to_string())?,
        std::ffi::CString::new(name).map_err(|e| e.to_string())?,
    );
    let prog = result::create_program(&src_c, Some(&name_c)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` was just created and is destroyed once below, after its last use;
    // `src_c` and `name_c` outlive it; the CUBIN buffer is sized by NVRTC's own query.
    let out = unsafe {
        let compiled = result::compile_program(prog, options);
        let cubin = compiled.and_then(|()| {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
            let mut bytes = vec![0u8; size];
            sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr().cast()).result()?;
            Ok(bytes)
        });
        let out = cubin.map_err(|e| {
            // The log is NUL-terminated text (empty where NVRTC gives none).
            let log = result::get_program_log(prog).unwrap_or_default();
            let log: Vec<u8> = log
                .iter()
                .map(|&c| c as u8)
                .take_while(|&c| c != 0)
                .collect();
            format!("{e:?}\n{}", String::from_utf8_lossy(&log))
        });
        let _ = result::destroy_program(prog);
        out
    };
    out.map(Ptx::from_binary)
}

#[cfg(test)]
mod tests {
    use super::{cuda_version, ptxas_flags};

    #[test]
    fn ptxas_options_go_to_nvrtc_one_a_flag() {
        assert!(ptxas_flags("").is_empty());
        assert!(ptxas_flags(" , ").is_empty());
        assert_eq!(
            ptxas_flags("--register-usage-level=10, -v"),
            [
                "--ptxas-options=--register-usage-level=10",
                "--ptxas-options=-v"
            ]
        );
    }

    #[test]
    fn driver_versions_read_as_cuda_releases() {
        assert_eq!(cuda_version(13_000), "13.0");
        assert_eq!(cuda_version(12_040), "12.4");
        assert_eq!(cuda_version(12_080), "12.8");
    }
}
