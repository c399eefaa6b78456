//! Strings crossing the boundary: borrowed (`shardlimit_str`) and owned
//! (`shardlimit_string`, freed with `shardlimit_string_free`).

use super::*;

/// A borrowed string: `len` bytes of UTF-8 at `ptr`, followed by a NUL byte that `len`
/// does not count (so `ptr` can also be used as a C string). The function that returns it
/// says how long it stays valid; never free it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct shardlimit_str {
    /// The first byte; never NULL in strings the library returns.
    pub ptr: *const c_char,
    /// The length in bytes, without the NUL.
    pub len: usize,
}

impl shardlimit_str {
    pub(crate) fn from_static(s: &'static std::ffi::CStr) -> shardlimit_str {
        shardlimit_str {
            ptr: s.as_ptr(),
            len: s.to_bytes().len(),
        }
    }
    pub(crate) fn from_cstring(s: &CString) -> shardlimit_str {
        shardlimit_str {
            ptr: s.as_ptr(),
            len: s.as_bytes().len(),
        }
    }
    pub(crate) const EMPTY: shardlimit_str = shardlimit_str {
        ptr: c"".as_ptr(),
        len: 0,
    };
}

/// An owned string: `len` bytes of UTF-8 at `ptr`, followed by a NUL byte that `len` does
/// not count. The caller owns it and must release it with `shardlimit_string_free()`.
#[repr(C)]
#[derive(Debug)]
pub struct shardlimit_string {
    /// The first byte; NULL for an empty (or already freed) struct.
    pub ptr: *mut c_char,
    /// The length in bytes, without the NUL.
    pub len: usize,
}

/// The addresses of the owned strings (`shardlimit_string`) not yet freed. A B-tree, for
/// the reason given on `Handles::live`.
pub(crate) static STRINGS: RwLock<BTreeMap<usize, ()>> = RwLock::new(BTreeMap::new());

pub(crate) fn owned_string(s: String) -> shardlimit_string {
    let c = to_cstring(s);
    let len = c.as_bytes().len();
    let ptr = c.into_raw();
    STRINGS.write().insert(ptr as usize, ());
    shardlimit_string { ptr, len }
}

/// NUL bytes cannot cross as C strings; they never appear in the core's messages, but a
/// message quoting user input could carry one.
pub(crate) fn to_cstring(s: String) -> CString {
    CString::new(s).unwrap_or_else(|e| {
        let cleaned: Vec<u8> = e
            .into_vec()
            .into_iter()
            .map(|b| if b == 0 { b'?' } else { b })
            .collect();
        CString::new(cleaned).expect("NUL bytes were replaced")
    })
}

/// Frees the bytes of an owned string and sets `s->ptr` to NULL and `s->len` to 0, so
/// freeing the same struct twice is harmless. `s == NULL`, `s->ptr == NULL`, or bytes
/// that are not (or no longer) an owned string of the library, is a no-op. A string is
/// real memory, not a handle: free it through one struct, not through copies of it.
#[no_mangle]
pub unsafe extern "C" fn shardlimit_string_free(s: *mut shardlimit_string) {
    quiet((), || {
        let Some(s) = inout_arg(s) else {
            return;
        };
        let ptr = s.ptr;
        if ptr.is_null() {
            return;
        }
        let ours = STRINGS.write().remove(&(ptr as usize)).is_some();
        if ours {
            // SAFETY: `ptr` came from `CString::into_raw` in `owned_string` (it was in
            // STRINGS), and removing it from STRINGS under the lock makes this the only
            // free of it.
            drop(unsafe { CString::from_raw(ptr) });
        }
        s.ptr = std::ptr::null_mut();
        s.len = 0;
    })
}
