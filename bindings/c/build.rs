//! Gives libshardlimit.so a SONAME, libshardlimit.so.<major>, so that programs linked
//! against the SDK (lib/libshardlimit.so -> libshardlimit.so.<major>) record the major
//! version they were built for and the loader refuses an incompatible one. On macOS the
//! same role is the install name, @rpath/libshardlimit.<major>.dylib (the SDK's file).
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let major =
        std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets CARGO_PKG_VERSION_MAJOR");
    if os == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libshardlimit.so.{major}");
    } else if os == "macos" {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-install_name,@rpath/libshardlimit.{major}.dylib"
        );
    }
    println!("cargo:rerun-if-changed=build.rs");
}
