// macOS needs `-undefined dynamic_lookup` for an extension module built by plain cargo
// (maturin adds it itself); elsewhere this prints nothing.
fn main() {
    // Without a rerun-if-changed line cargo reruns this script, and rebuilds the extension
    // (a release build with LTO: minutes), whenever any file of the package changes,
    // Python sources and tests included. Nothing here reads a file.
    println!("cargo:rerun-if-changed=build.rs");
    pyo3_build_config::add_extension_module_link_args();
    windows_exports(&["PyInit__shardlimit".to_string()]);
}

/// Windows (MinGW): the DLL's exports, as a .def file the linker takes as an input. rustc
/// writes one itself but passes it as `-Wl,<file>`, which cargo-zigbuild drops (zig's driver
/// takes a .def only as an input file), and the DLL would then export every symbol it holds.
fn windows_exports(names: &[String]) {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("windows") {
        return;
    }
    let def = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join("exports.def");
    std::fs::write(&def, format!("EXPORTS\n    {}\n", names.join("\n    ")))
        .expect("write exports.def");
    println!("cargo:rustc-cdylib-link-arg={}", def.display());
}
