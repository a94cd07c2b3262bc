//! Running a model's forward passes behind other work on the same cores. A gateway
//! replays providers' jobs to verify them; where it runs beside a provider (a provider's
//! own gateway, a testnet on one host) those replays took cores from the serving engine
//! at equal priority, and the provider's decode slowed by a fifth while they ran. A
//! replay is not on anyone's critical path: its threads are lowered to the lowest nice
//! level, so they take what serving leaves and still make progress on a loaded host
//! (nice 19 has ~1.5% of a nice-0 thread's share, not SCHED_IDLE's ~0.3%).

#![allow(unsafe_code)] // two libc calls on the calling thread's own id.

use std::io;

/// The nice level a background pool's threads run at.
pub const BACKGROUND_NICE: i32 = 19;

/// Lowers the calling thread (only it: Linux schedules threads, and `setpriority` on a
/// thread id changes that thread alone) to [`BACKGROUND_NICE`].
#[cfg(target_os = "linux")]
pub(crate) fn lower_this_thread() -> io::Result<()> {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: plain syscall on our own thread id; an error is reported through errno.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_this_thread() -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "per-thread priority is set only on Linux",
    ))
}

/// The calling thread's nice level (tests).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn this_thread_nice() -> i32 {
    // SAFETY: as above.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // SAFETY: getpriority on our own thread id; -1 is also a valid level, but not here.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) }
}
