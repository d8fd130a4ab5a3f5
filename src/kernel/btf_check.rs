//! Whether a BTF file describes the running kernel (`--btf FILE`): the
//! kernel's release string read through the file's struct layouts
//! (bpf/btf_check.bpf.c) must be `uname -r`. Another kernel's file puts the
//! fields elsewhere, and its numbers would be wrong: refused instead.

use std::mem::MaybeUninit;
use std::path::Path;

use anyhow::{Context, Result};
use libbpf_rs::{OpenObject, ProgramInput};

skeleton!("btf_check");

use skel::BtfCheckSkelBuilder;

/// Why the release could not be read through a BTF file.
pub enum CheckFailed {
    /// The check did not open or load: the file's layouts do not fit.
    Load(anyhow::Error),
    /// It loaded but the kernel would not run it (test runs of raw
    /// tracepoint programs came in 5.10).
    Run(anyhow::Error),
}

/// The running kernel's release, as read through the layouts of `btf`.
pub fn release_through(btf: &Path) -> std::result::Result<String, CheckFailed> {
    let mut slot = MaybeUninit::<OpenObject>::uninit();
    let open = open_with_btf(BtfCheckSkelBuilder::default(), &mut slot, Some(btf))
        .context("opening the BTF check")
        .map_err(CheckFailed::Load)?;
    let skel = crate::kernel::load_skel(open)
        .context("loading the BTF check")
        .map_err(CheckFailed::Load)?;
    skel.progs
        .read_release
        .test_run(ProgramInput::default())
        .map_err(|e| CheckFailed::Run(e.into()))?;
    let bss = skel
        .maps
        .bss_data
        .as_deref()
        .context("no .bss")
        .map_err(CheckFailed::Load)?;
    // SAFETY: the kernel wrote it behind the compiler's back.
    let raw = unsafe { std::ptr::read_volatile(&bss.release) };
    Ok(crate::kernel::skel::c_str(&raw))
}

/// Opens a skeleton, relocated against `btf` when given (libbpf's
/// `btf_custom_path`) instead of the kernel's own BTF.
pub fn open_with_btf<'obj, B: libbpf_rs::skel::SkelBuilder<'obj>>(
    builder: B,
    slot: &'obj mut std::mem::MaybeUninit<libbpf_rs::OpenObject>,
    btf: Option<&Path>,
) -> Result<B::Output> {
    let Some(btf) = btf else {
        return Ok(builder.open(slot)?);
    };
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(btf.as_os_str().as_bytes())?;
    let opts = libbpf_sys::bpf_object_open_opts {
        sz: std::mem::size_of::<libbpf_sys::bpf_object_open_opts>() as _,
        // libbpf copies it while opening.
        btf_custom_path: path.as_ptr(),
        ..Default::default()
    };
    Ok(builder.open_opts(opts, slot)?)
}
