//! Every read and write through a pointer a C caller passed in happens here, in these few
//! audited helpers; the rest of the crate gets references, slices and [`Out`] values that
//! are checked for NULL and alignment first.
//!
//! What makes them sound is the ABI's contract, the header's preamble: a string or array
//! argument that is not NULL points to `len` (`count`) readable values that stay valid and
//! unchanged for the duration of the call and are not retained after it; an out-parameter
//! that is not NULL points to writable memory for one value of its type, not read before
//! it is written. A caller breaking it is undefined behaviour on the C side that no check
//! here can detect; every function taking such pointers is an `unsafe extern "C" fn` for
//! that reason. Handles are never dereferenced (`handles.rs`).

use super::*;

/// `len` bytes at `ptr`, borrowed for the call; NULL is the empty string when `len` is 0.
pub(crate) fn bytes_arg<'a>(what: &str, ptr: *const c_char, len: usize) -> Result<&'a [u8], Error> {
    if ptr.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(invalid(what, format!("is NULL with length {len}")))
        };
    }
    if len > isize::MAX as usize {
        return Err(invalid(what, format!("has an impossible length {len}")));
    }
    // SAFETY: not NULL, and by the ABI's contract `len` readable bytes for the call; `len`
    // is at most isize::MAX (checked above); u8 has no alignment requirement.
    Ok(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

/// `count` values at `ptr`, borrowed for the call; NULL is accepted only when `count` is 0.
/// The caller bounds `count` first.
pub(crate) fn slice_arg<'a, T>(what: &str, ptr: *const T, count: usize) -> Result<&'a [T], Error> {
    if count == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() || !ptr.is_aligned() {
        return Err(invalid(what, "is NULL or misaligned"));
    }
    if count.saturating_mul(std::mem::size_of::<T>()) > isize::MAX as usize {
        return Err(invalid(what, format!("has an impossible length {count}")));
    }
    // SAFETY: not NULL, aligned, the size fits isize (checked above), and by the ABI's
    // contract `count` initialised values of T for the call.
    Ok(unsafe { std::slice::from_raw_parts(ptr, count) })
}

/// The one value at `p`, borrowed for the call.
pub(crate) fn ref_arg<'a, T>(what: &str, p: *const T) -> Result<&'a T, Error> {
    if p.is_null() {
        return Err(invalid(what, "is NULL"));
    }
    if !p.is_aligned() {
        return Err(invalid(what, "is not aligned for its type"));
    }
    // SAFETY: not NULL, aligned, and by the ABI's contract an initialised T for the call.
    Ok(unsafe { &*p })
}

/// A checked out-parameter: written at most once, as a call's last step.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// Writes `v` without reading or dropping what was there (out-parameters may be
    /// uninitialised).
    pub(crate) fn write(self, v: T) {
        // SAFETY: not NULL and aligned (`out_arg`), and by the ABI's contract writable for
        // one T.
        unsafe { self.0.write(v) }
    }
}

/// A required out-parameter.
pub(crate) fn out_arg<T>(what: &str, p: *mut T) -> Result<Out<T>, Error> {
    if p.is_null() {
        Err(invalid(what, "is NULL; an output pointer is required"))
    } else if !p.is_aligned() {
        Err(invalid(what, "is not aligned for its type"))
    } else {
        Ok(Out(p))
    }
}

/// An optional out-parameter: None for NULL.
pub(crate) fn opt_out_arg<T>(what: &str, p: *mut T) -> Result<Option<Out<T>>, Error> {
    if p.is_null() {
        Ok(None)
    } else {
        out_arg(what, p).map(Some)
    }
}

/// A checked output array of `cap` values, written by index (completions, bytes).
pub(crate) struct OutArray<T> {
    ptr: *mut T,
    cap: usize,
}

impl<T> OutArray<T> {
    /// Writes `v` at index `i` (below the capacity, or a panic the guard turns into
    /// INTERNAL), without reading or dropping what was there.
    pub(crate) fn write(&mut self, i: usize, v: T) {
        assert!(
            i < self.cap,
            "index {i} past an output array of {}",
            self.cap
        );
        // SAFETY: `ptr` is not NULL and aligned (`out_array_arg`), `i` is below `cap`, and by
        // the ABI's contract the caller's array holds `cap` writable values of T.
        unsafe { self.ptr.add(i).write(v) }
    }

    /// Copies `src` to the start of the array (at most its capacity, or a panic).
    pub(crate) fn copy_from(&mut self, src: &[T])
    where
        T: Copy,
    {
        assert!(
            src.len() <= self.cap,
            "{} values past an output array of {}",
            src.len(),
            self.cap
        );
        if src.is_empty() {
            return;
        }
        // SAFETY: as in `write`, for `src.len() <= cap` values; `src` is our own memory, so
        // the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr, src.len()) }
    }
}

/// An output array of `cap` values at `p`: NULL is accepted only when `cap` is 0.
pub(crate) fn out_array_arg<T>(what: &str, p: *mut T, cap: usize) -> Result<OutArray<T>, Error> {
    if cap == 0 {
        return Ok(OutArray {
            ptr: std::ptr::NonNull::dangling().as_ptr(),
            cap: 0,
        });
    }
    let Out(ptr) = out_arg(what, p)?;
    Ok(OutArray { ptr, cap })
}

/// The struct at `p` for the function to update in place (`shardlimit_string_free`): None
/// for NULL or a misaligned pointer.
pub(crate) fn inout_arg<'a, T>(p: *mut T) -> Option<&'a mut T> {
    if p.is_null() || !p.is_aligned() {
        return None;
    }
    // SAFETY: not NULL, aligned, and by the ABI's contract an initialised T the caller
    // does not touch during the call.
    Some(unsafe { &mut *p })
}
